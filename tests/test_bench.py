"""The engine benchmark runs on CPU with random weights (tiny configs): both tables,
every batch size, the spread of its repeats. Speeds are printed, never asserted."""

import re

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
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
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
