"""The drafters benchmark's pieces: method parsing and one configuration's row."""

import pytest

from relaxtune.bench.drafters import parse_methods, summarize
from relaxtune.decoding.speed import CostProfile
from relaxtune.engine.sequence import Generation, GenerationStats


def _gen(tokens, rounds, accepted, reason="stop", text="ok"):
    return Generation([1] * tokens, text, GenerationStats(rounds=rounds, accepted=accepted, response_tokens=tokens,
                                                          finish_reason=reason))


def test_parse_methods():
    assert parse_methods("strict, ens:0.2,typical:0.09") == [("strict", None), ("ens", 0.2), ("typical", 0.09)]
    with pytest.raises(ValueError, match="outside the valid range"):
        parse_methods("ears:2")
    with pytest.raises(ValueError, match="unknown method"):
        parse_methods("medusa")


def test_summarize_one_configuration():
    profile = CostProfile(t_ar=0.1, t_draft=0.0001)
    gens = [_gen(100, 40, 60), _gen(200, 50, 90, reason="length", text="x" + "ab" * 40)]
    row = summarize(gens, {0: True, 1: False}, strict_len=100.0, profile=profile, n_draft=4)
    assert row["l_accept"] == pytest.approx(150 / 90) and row["length"] == 150 and row["len/strict"] == 1.5
    assert row["loops"] == 0.5 and row["trunc"] == 0.5 and row["math acc"] == 0.5 and row["c_rel"] == 0.001
    assert row["speed-up"] == pytest.approx((100 / 150) * (150 / 90 + 1) / (1 + 4 * 0.001))
