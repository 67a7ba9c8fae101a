"""The drafters benchmark's pieces: method parsing and one configuration's row."""

import pytest

from relaxtune.bench.drafters import parse_methods, summarize
from relaxtune.decoding.speed import CostProfile
from relaxtune.engine.sequence import Generation, GenerationStats


def _gen(tokens, rounds, accepted, reason="stop", text="ok"):
    return Generation(
        [1] * tokens,
        text,
        GenerationStats(rounds=rounds, accepted=accepted, response_tokens=tokens, finish_reason=reason),
    )


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


def test_run_config_returns_responses_in_prompt_order(tiny_pair_dirs):
    from relaxtune.backends.hf import load_pair
    from relaxtune.bench.drafters import run_config
    from relaxtune.decoding.sampling import SamplingParams

    backend = load_pair("prompt-lookup", tiny_pair_dirs[1], dtype="float32")
    prompts = [[3, 4, 5, 3, 4], [7, 8, 9, 10, 7, 8, 9], [5]]
    gens = run_config(backend, prompts, "ears", 0.3, 3, 8, SamplingParams(0.6, top_k=20, top_p=0.95))
    assert [len(g.token_ids) for g in gens] == [8, 8, 8]
    again = run_config(backend, prompts, "ears", 0.3, 3, 8, SamplingParams(0.6, top_k=20, top_p=0.95))
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]  # fixed seeds: every configuration alike
