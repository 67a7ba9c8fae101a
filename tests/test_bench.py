"""The engine benchmark runs on CPU with random weights (tiny configs): both tables,
every batch size, the spread of its repeats. Speeds are printed, never asserted."""

import json
import re

import pytest
import torch

from relaxtune.bench.batching import batch_table
from relaxtune.bench.engine import main
from relaxtune.bench.harness import NOISY, build, fmt, median_spread

from .tiny_models import tiny_lm


def _configs(tmp_path) -> tuple[str, str]:
    dirs = []
    for name, seed in (("drafter", 1), ("verifier", 0)):
        tiny_lm(vocab=64, seed=seed).config.save_pretrained(tmp_path / name)
        dirs.append(str(tmp_path / name))
    return dirs[0], dirs[1]


@pytest.mark.slow
def test_random_weights_bench_prints_both_tables(tmp_path, capsys):
    drafter, verifier = _configs(tmp_path)
    assert (
        main(
            [
                "--random-weights",
                "--drafter",
                drafter,
                "--verifier",
                verifier,
                "--dtype",
                "float32",
                "--device",
                "cpu",
                "--drafts",
                "2",
                "--batch-sizes",
                "1,2,4",
                "--batch-n-draft",
                "2",
                "--max-new-tokens",
                "6",
                "--prompts",
                "4",
                "--repeats",
                "2",
                "--json",
                str(tmp_path / "engine.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "engine.json").read_text())
    assert result["benchmark"] == "engine" and "--json" not in result["command"]
    single, batch = result["tables"]
    assert single["columns"] == ["N", "(a)", "(b)", "(c)", "(d)", "(e)", "(d) l_accept", "d/a", "d/b", "e/d"]
    assert [r[0] for r in single["rows"]] == [2] and all(v > 0 for v in single["rows"][0][1:6])
    assert batch["columns"] == ["B", "A tok/s", "S tok/s", "S l_accept", "S/A"]
    assert [r[0] for r in batch["rows"]] == [1, 2, 4]
    assert "float32 on cpu" in out and "median ±spread of 2 repeats" in out
    assert "(a) transformers AR" in out and "(d) relaxtune strict" in out and "c_rel" in out
    assert "random weights: acceptance is not meaningful; S_max at l_accept = N" in out
    rows = [line for line in out.splitlines() if re.match(r"\s*[124] \|", line)]
    assert [int(r.split("|")[0]) for r in rows] == [1, 2, 4]
    assert rows[0].split("|")[6].strip() == "1.00 ±0%"  # S/S(B=1) at B = 1


def test_batch_table_runs_every_response_to_its_length(tmp_path):
    drafter, verifier = _configs(tmp_path)

    class Args:
        random_weights, dtype, device, prompts = True, "float32", "cpu", 5

    Args.drafter, Args.verifier = drafter, verifier
    backend, prompts = build(Args)
    assert len(prompts) == 5 and len({len(p) for p in prompts}) == 5 and backend.eos_token_ids == frozenset()
    assert not torch.equal(backend.drafter.lm_head.weight, backend.verifier.lm_head.weight)  # seeded apart
    figures = batch_table(backend, prompts, [1, 3], n_draft=2, max_new=7, repeats=1)
    for b in (1, 3):
        assert figures[b]["tps"][0] > 0 and figures[b]["hf_tps"][0] > 0 and 0 <= figures[b]["l_accept"][0] <= 2


def test_spread_marks_a_disturbed_figure():
    mid, spread = median_spread([2.0, 2.2, 1.8])
    assert mid == 2.0 and abs(spread - 0.2) < 1e-12
    assert fmt([2.0, 2.2, 1.8]) == "2.00 ±20%!" and spread > NOISY
    assert fmt([2.0, 2.02, 2.01]) == "2.01 ±1%"


def test_transformers_generate_gets_only_what_it_takes_from_its_keywords(caplog):
    """The (a)/(b) runs of the engine benchmark on a pair with an EOS id (the embedded pair has
    one): no logits processor passed twice (``min_new_tokens`` made assisted generation hand
    transformers' own MinNewTokensLengthLogitsProcessor back to the assistant), every round
    drafts exactly N (``num_assistant_tokens`` as a keyword was ignored: 20 drafts, confidence
    threshold 0.4), fixed lengths though EOS is likely, the drafter's config restored after."""
    from transformers.generation import utils as generation_utils
    from transformers.testing_utils import CaptureLogger

    from relaxtune.backends.hf import HFBackend
    from relaxtune.backends.transformers_compat import record_assisted_rounds
    from relaxtune.bench.harness import hf_generate

    from .tiny_models import noisy_copy

    verifier = tiny_lm(vocab=64, seed=0)
    drafter = noisy_copy(verifier, 0.05)
    eos = int(verifier.lm_head.weight.norm(dim=1).argmax())  # a likely token
    for m in (verifier, drafter):
        m.generation_config.eos_token_id = eos
    backend = HFBackend(drafter, verifier, name="tiny")
    before = drafter.generation_config.to_dict()
    generation_utils.logger.warning_once.cache_clear()
    with CaptureLogger(generation_utils.logger) as log, record_assisted_rounds() as rounds:
        assert hf_generate(backend, [[1, 2, 3]], 12, n_draft=3, seed=0) == 12
        assert hf_generate(backend, [[1, 2, 3], [4, 5]], 12, seed=1) == 24  # AR, batched, left-padded
    assert "logits processor" not in log.out
    assert rounds and all(drafted == 3 for drafted, _ in rounds[:-1]) and rounds[-1][0] <= 3
    assert sum(acc + 1 for _, acc in rounds) == 12
    assert drafter.generation_config.to_dict() == before
