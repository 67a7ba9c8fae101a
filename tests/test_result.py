"""The frozen result a finished job hands to ``report/`` (``Tuner.result``), and the job's
two entry points (``tune_job``, ``export_job``) as compositions of shared steps."""

import dataclasses
import inspect

import pytest

from relaxtune.decoding.speed import speedup
from relaxtune.job import run as job
from relaxtune.report.export import build_config
from relaxtune.tune.result import JobResult

from .synthetic import PROBLEMS, Synthetic
from .test_tuning import make


def test_the_result_is_frozen_and_keeps_what_the_job_had_when_it_was_taken(tmp_path):
    tuner = make(tmp_path, Synthetic(cliff=1.0), trials=4, n_drafts=[4, 6])
    outcome = tuner.tune_method("cactus")
    result = tuner.result([outcome], confirm_problems=7)
    assert isinstance(result, JobResult)
    assert (result.problems, result.confirm_problems, result.outcomes, dict(result.confirmations)) == (
        len(PROBLEMS),
        7,
        (outcome,),
        {},
    )
    assert list(result.baselines) == sorted(tuner.baselines) and result.pinned == frozenset()
    for n, b in result.baselines.items():  # strict's modeled speed-up at N: length ratio 1, l_accept capped at N
        assert result.strict_speedup(n) == pytest.approx(speedup(min(b.l_accept, n), n, 0.2))
        assert result.strict_points()[n] == (result.strict_speedup(n), b.accuracy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.problems = 3
    with pytest.raises(TypeError):  # read-only mappings
        result.baselines[99] = result.baselines[4]
    before = dict(result.baselines)
    tuner.baseline(8)  # the tuner goes on; the result does not follow it
    tuner.settings.epsilon = 0.5
    assert dict(result.baselines) == before and 8 not in result.strict_speedups and result.stats.epsilon == 0.05
    assert build_config(result).epsilon == 0.05


def test_tune_and_export_are_two_jobs_and_run_tune_job_picks_one(monkeypatch):
    called = []
    monkeypatch.setattr(job, "tune_job", lambda s, b, **kw: called.append(("tune", s, b, kw)) or ("c", "p"))
    monkeypatch.setattr(job, "export_job", lambda s, b, **kw: called.append(("export", s, b, kw)) or ("c", "p"))
    assert job.run_tune_job("s", "b", log=print) == ("c", "p")
    assert job.run_tune_job("s", new_trials=False, progress=False) == ("c", "p")
    assert called == [("tune", "s", "b", {"log": print}), ("export", "s", None, {"progress": False})]
    # the same keyword arguments for both (the CLI and the flow pass them through run_tune_job)
    assert inspect.signature(job.tune_job).parameters.keys() == inspect.signature(job.export_job).parameters.keys()
