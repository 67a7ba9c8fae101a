"""Synthetic evaluations with a known truth, for tuner and confirmation tests (no
models): ``Synthetic`` (``relaxtune.testing.synthetic``) and ``Lucky``, where luck
can pass the search."""

from __future__ import annotations

import random
from pathlib import Path

from relaxtune.tasks.spec import Problem
from relaxtune.testing.synthetic import PROBLEMS, SPEC, Synthetic, SyntheticPair, write_task
from relaxtune.tune.evaluation import sample_seed
from relaxtune.tune.point_records import summarize

__all__ = ["PROBLEMS", "SPEC", "Synthetic", "SyntheticPair", "write_task", "Lucky"]


def _record(problem: Problem, repeat: int, correct: bool, l_accept: float, seed: int = 0) -> dict:
    rounds = 10
    return dict(
        problem_id=problem.id,
        repeat=repeat,
        seed=seed,
        failed=False,
        correct=correct,
        verdict="correct" if correct else "wrong",
        output="x",
        finish_reason="stop",
        response_tokens=100,
        stats={"rounds": rounds, "accepted": round(l_accept * rounds), "wall_seconds": 1.0},
    )


class Lucky:
    """``evaluate`` stand-in where luck can pass the search: strict is always
    right (acceptance ``N * 0.2``); a relaxed point with knob k accepts
    ``N * k / (k + 1)`` and fails each sample independently with probability
    ``loss(k)`` (its true drop), drawn from the sample's seed, except that on the
    search's base seed ``search_seed`` points with k >= ``lucky_from`` lose
    nothing (they pass the search by luck). Records every call."""

    def __init__(
        self, loss=lambda k: 0.0 if k <= 1.0 else 0.3, lucky_from: float = 5.0, search_seed: int = 0, repeats: int = 1
    ):
        self.loss, self.lucky_from, self.search_seed, self.repeats = loss, lucky_from, search_seed, repeats
        self.calls: list[tuple] = []

    def __call__(self, spec, backend, config, *, output_dir, problems, progress):
        self.calls.append((config.method, config.knob, config.n_draft, len(problems), config.seed))
        k = config.knob
        relaxed = config.method != "strict"
        l_accept = config.n_draft * (k / (k + 1) if relaxed else 0.2)
        lucky = relaxed and config.seed == self.search_seed and k >= self.lucky_from
        records = []
        for p in problems:
            for r in range(self.repeats):
                seed = sample_seed(config.seed, p.id, r)
                wrong = relaxed and not lucky and random.Random(seed).random() < self.loss(k)
                records.append(_record(p, r, not wrong, l_accept, seed))
        return summarize(records, Path(output_dir) / f"{config.label}.jsonl")
