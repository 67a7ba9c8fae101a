"""Which task specs the scheduled ``tune_new`` flow tunes."""

import os
import time

import pytest
import yaml

from relaxtune.tune.schedule import untuned

from .tiny_task import write_tiny_task


def _config(path, task: str, version: int, created: str | None = None, pair: tuple | None = None) -> None:
    fields = {"task": task, "task_version": version} | ({"created": created} if created else {})
    fields |= {"drafter": pair[0], "verifier": pair[1]} if pair else {}
    path.write_text(yaml.safe_dump(fields))


def test_new_bumped_and_edited_specs_need_tuning(tmp_path, monkeypatch, user_tasks_only):
    evals, extra, runs = tmp_path / "evals", tmp_path / "extra", tmp_path / "runs"
    for d in (evals, extra, runs):
        d.mkdir()
    monkeypatch.setenv("RELAXTUNE_EVALS", str(evals))
    spec = write_tiny_task(evals)  # tiny_math v1
    assert [(p.name, p.reason) for p in untuned([], runs)] == [("tiny_math", "never tuned")]

    _config(runs / "tiny_math.tuned.yaml", "tiny_math", 1, "2999-01-01T00:00:00+00:00")
    assert untuned([], runs) == []  # tuned for this version, after the spec was written
    _config(runs / "tiny_math.tuned.yaml", "tiny_math", 1)  # no `created`: the file's time counts
    os.utime(spec, (time.time() + 60, time.time() + 60))
    assert [p.reason for p in untuned([], runs)] == ["spec modified after its tuned config was made"]
    _config(runs / "tiny_math.tuned.yaml", "tiny_math", 1, "2000-01-01T00:00:00+00:00")
    assert [p.reason for p in untuned([], runs)] == ["spec modified after its tuned config was made"]
    _config(runs / "tiny_math.tuned.yaml", "tiny_math", 1, "2999-01-01T00:00:00+00:00", ("d", "v"))
    assert untuned([], runs, ("d", "v")) == []
    assert [p.reason for p in untuned([], runs, ("d", "other"))] == ["tuned for d -> v, not d -> other"]
    _config(runs / "tiny_math.tuned.yaml", "tiny_math", 2, "2999-01-01T00:00:00+00:00")
    assert [p.reason for p in untuned([], runs)] == ["tuned for version 2, the spec is version 1"]

    other = write_tiny_task(extra)  # the same task name in an extra folder: the first one wins
    (extra / "other.yaml").write_text(open(other).read().replace("name: tiny_math", "name: other_task"))
    (extra / "broken.yaml").write_text("name: [unclosed")  # skipped with a warning, the others still tune
    found = untuned([extra], runs)
    assert [(p.name, p.path) for p in found] == [("other_task", str(extra / "other.yaml")), ("tiny_math", spec)]
    with pytest.raises(FileNotFoundError, match="no folder of task specs"):
        untuned([tmp_path / "missing"], runs)


def test_a_spec_whose_data_cannot_load_says_why(tmp_path):
    from relaxtune.tune.schedule import Pending, unavailable

    good = write_tiny_task(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(good).read().replace("tiny_math.jsonl", "absent.jsonl"))
    assert unavailable(Pending("tiny_math", good, "never tuned")) is None
    why = unavailable(Pending("tiny_math", str(bad), "never tuned"))
    assert why.startswith("its data cannot be loaded (") and "absent.jsonl" in why and "\n" not in why


def test_a_spec_whose_budget_is_shorter_than_a_draft_length_says_why(tmp_path):
    from relaxtune.tune.schedule import Pending, unavailable

    short = Pending("tiny_math", write_tiny_task(tmp_path, max_new_tokens=10), "never tuned")
    assert unavailable(short, [3, 10]) is None  # a draft length equal to the budget fits
    why = unavailable(short, [3, 5, 10, 20])  # the default draft lengths: 20 does not
    assert why == (
        "--n-drafts 3,5,10,20: a draft length of 20 exceeds the task's 10-token response budget "
        "(max_new_tokens): give draft lengths up to 10"
    )
