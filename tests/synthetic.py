"""A synthetic evaluation with a known optimum, for tuner tests (no models)."""

from __future__ import annotations

from pathlib import Path

from relaxtune.evaluation import summarize
from relaxtune.tasks import Problem, TaskSpec

SPEC = TaskSpec(name="synthetic", version=2, dataset={"path": "json", "data_files": "unused.jsonl"},
                grader={"kind": "math"}, max_new_tokens=64)
PROBLEMS = [Problem(str(i), f"q{i}", str(i)) for i in range(200)]


class Synthetic:
    """``evaluate`` stand-in: strict is always right; a relaxed point with knob k
    accepts ``N * k / (k + 1)`` drafts per round and gets every problem wrong
    past ``cliff`` (a step drop of ``drop``). Records every call."""

    def __init__(self, cliff: float = 1.0, drop: float = 0.5, fail_above: float | None = None):
        self.cliff, self.drop, self.fail_above = cliff, drop, fail_above
        self.calls: list[tuple] = []

    def __call__(self, spec, backend, config, *, output_dir, problems, progress):
        self.calls.append((config.method, config.knob, config.n_draft, len(problems)))
        k = config.knob
        if self.fail_above is not None and k is not None and k > self.fail_above:
            raise RuntimeError("evaluation exploded")
        relaxed = config.method != "strict"
        l_accept = config.n_draft * (k / (k + 1)) if relaxed and k is not None else config.n_draft * 0.5
        bad_every = int(round(1 / self.drop)) if relaxed and k is not None and k > self.cliff else 0
        records = []
        for i, p in enumerate(problems):
            correct = not (bad_every and i % bad_every == 0)
            rounds = 10
            records.append(dict(problem_id=p.id, repeat=0, failed=False, correct=correct, verdict="correct" if correct else "wrong",
                                output="x", finish_reason="stop", response_tokens=100,
                                stats={"rounds": rounds, "accepted": round(l_accept * rounds), "wall_seconds": 1.0}))
        return summarize(records, Path(output_dir) / f"{config.label}.jsonl")
