"""The selection benchmark's backend and one job through the product's own path."""

import numpy as np
import optuna
import pytest

from relaxtune.bench.selection import harm_sets, one_job


def test_harm_sets_keep_each_problems_rate_and_share_as_named():
    rng, ids, knobs, rate = np.random.default_rng(0), [str(i) for i in range(20000)], [1.0, 2.0], 0.1
    for structure, overlap in (
        ("independent", rate * rate),
        ("half", rate / 2 + (rate / 2) ** 2 / (1 - rate / 2) ** 2 * (1 - rate / 2)),
        ("shared", rate),
    ):
        sets = harm_sets(rng, ids, knobs, rate, structure)
        for k in knobs:
            assert abs(len(sets[k]) / len(ids) - rate) < 4 * (rate * (1 - rate) / len(ids)) ** 0.5, structure
        both = len(sets[1.0] & sets[2.0]) / len(ids)
        assert both == pytest.approx(overlap, abs=0.006), structure
    shared = harm_sets(rng, ids, knobs, rate, "shared")
    assert shared[1.0] is shared[2.0]


def test_one_job_exports_a_harmless_point_and_never_a_ruinous_one(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = np.random.default_rng(1)
    assert one_job(rng, 164, 3, "independent", "greedy", 0.0, "holdout", 0.05, 0.9, str(tmp_path))
    assert not one_job(rng, 164, 3, "shared", "sampled", 0.3, "holdout", 0.05, 0.9, str(tmp_path))
