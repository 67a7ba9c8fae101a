"""The serving profile (``relaxtune.decoding.serving``): speed-ups per batch size, the
weighted objective, the crossover batch size and the round trip through JSON."""

import json

import pytest

from relaxtune.decoding.serving import ServingProfile, default_batch_sizes, stops_paying_at
from relaxtune.decoding.speed import CostProfile, c_rel_of, modeled_speedup


def _gpu_like() -> ServingProfile:
    # batch 1: verifying 5 tokens costs one step (memory bound); batch 32: 5 steps (compute bound)
    return ServingProfile(
        {
            1: CostProfile(0.010, 0.001, {5: 0.010}, batch_size=1),
            32: CostProfile(0.020, 0.004, {5: 0.100}, batch_size=32),
        }
    )


def test_speedups_per_batch_size_are_the_papers_model_at_each_batch_size():
    s = _gpu_like()
    got = s.speedups(2.0, 4)
    assert got[1] == pytest.approx(3 * 0.010 / (4 * 0.001 + 0.010))  # 2.142857
    assert got[32] == pytest.approx(3 * 0.020 / (4 * 0.004 + 0.100))  # 0.517241
    # the length correction applies at every batch size alike
    assert s.speedups(2.0, 4, 100, 125)[32] == pytest.approx(got[32] * 0.8)


def test_the_objective_is_the_declared_batch_size_or_the_weighted_mean():
    s = _gpu_like()
    assert s.declared == 1 and s.speedup(2.0, 4) == pytest.approx(3 * 0.010 / 0.014)
    at32 = s.reweighted({32: 1.0})
    assert at32.declared == 32 and modeled_speedup(at32, 2.0, 4) == pytest.approx(0.06 / 0.116)
    mixed = s.reweighted({1: 1.0, 32: 3.0})
    assert mixed.declared == 32
    assert mixed.speedup(2.0, 4) == pytest.approx((0.03 / 0.014 + 3 * 0.06 / 0.116) / 4)
    assert c_rel_of(mixed) == pytest.approx(0.004 / 0.020)


def test_stops_paying_at_is_the_smallest_batch_size_from_which_none_pays():
    assert stops_paying_at({1: 1.8, 8: 1.2, 32: 0.9, 128: 0.6}) == 32
    assert stops_paying_at({1: 1.8, 8: 0.9, 32: 1.1, 128: 0.6}) == 128  # pays again at 32
    assert stops_paying_at({1: 1.8, 128: 1.0}) is None  # 1.0 is not below 1
    assert stops_paying_at({1: 0.7, 4: 0.6}) == 1
    with pytest.raises(ValueError):
        stops_paying_at({})


def test_round_trip_through_json_and_a_profile_saved_before_batch_sizes():
    s = _gpu_like().reweighted({1: 0.25, 32: 0.75})
    back = ServingProfile.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.at(32).batch_size == 32
    old = CostProfile(0.03, 0.01, {5: 0.1}, source="x, batch 1").to_dict()
    del old["batch_size"]
    single = ServingProfile.from_dict(old)
    assert single.batch_sizes == [1] and single.declared == 1 and single.at(1).t_verify == {5: 0.1}


def test_bad_profiles_and_weights_are_refused():
    p = CostProfile(0.01, 0.001)
    with pytest.raises(ValueError, match="one batch size"):
        ServingProfile({})
    with pytest.raises(ValueError, match="equal to their profile"):
        ServingProfile({4: p})  # p is batch 1
    with pytest.raises(ValueError, match="has no profile"):
        ServingProfile({1: p}, {8: 1.0})
    for w in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number > 0"):
            ServingProfile({1: p}, {1: w})
    with pytest.raises(ValueError, match="batch_size"):
        CostProfile(0.01, 0.001, batch_size=0)
    with pytest.raises(KeyError, match="profiled: \\[1\\]"):
        ServingProfile.single(p).at(8)


def test_default_batch_sizes():
    assert default_batch_sizes("cpu") == (1, 4, 16) == default_batch_sizes("llamacpp")
    assert default_batch_sizes("cuda") == (1, 8, 32, 128) == default_batch_sizes("cuda:1")


def test_difference_names_the_batch_size():
    a = _gpu_like()
    b = ServingProfile({**a.profiles, 32: CostProfile(0.020, 0.004, {5: 0.150}, batch_size=32)})
    gap, which = b.difference(a)
    assert gap == pytest.approx(0.5) and which == "batch 32: t_verify[5]/t_ar"
