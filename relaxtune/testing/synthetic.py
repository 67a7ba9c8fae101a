"""A synthetic evaluation with a known optimum (no models) for the tuner's tests,
the multi-worker tests and the scale benchmark, and a worker process that runs
the main job on it:

    python -m relaxtune.testing.synthetic SETTINGS.json [--delay 0.05] [--cliff 1] [--drop 0.5] [--strict-accept 0.2]

Strict is always right and accepts ``N strict_accept`` drafts per round; a
relaxed point with knob k accepts ``N k / (k + 1)`` and, past ``cliff``, gets every ``1/drop``-th problem wrong
(by problem number, so a range of problems is judged as in the whole). With
``delay``, each sample not recorded yet costs ``delay`` seconds of sleep (a
stand-in for generation that occupies no CPU) and is then appended to a JSONL
file per configuration under the output folder, so workers share finished
samples as they do with real records: claimed first as ``evaluate`` claims
them (``relaxtune.tune.claims``), so a sample is generated once, and carrying
the code identity a real record carries.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from relaxtune.tasks.spec import Problem, TaskSpec
from relaxtune.tune.claims import claim, claim_path
from relaxtune.tune.point_records import EvalResult, record_identity, records_path, summarize

__all__ = ["Synthetic", "SyntheticPair", "SPEC", "PROBLEMS", "write_task", "main"]

SPEC = TaskSpec(
    name="synthetic",
    version=2,
    dataset={"path": "json", "data_files": "unused.jsonl"},
    grader={"kind": "math"},
    max_new_tokens=64,
)
PROBLEMS = [Problem(str(i), f"q{i}", str(i)) for i in range(200)]


class SyntheticPair:
    """A stand-in backend: a name, nothing to load or measure."""

    name = "synthetic-pair"


class Synthetic:
    """``evaluate`` stand-in (same signature). Records every call in ``calls`` as
    ``(method, knob, n_draft, number of problems, base seed)`` and, with ``delay``,
    every sample it generated (not recorded yet) in ``generated`` as
    ``(task, config label, problem id)``.

    Args:
        cliff: knob values above it lose accuracy; drop: the share of problems then wrong.
        fail_above: knob values above it raise (a failing evaluation).
        delay: seconds per sample not recorded yet (0: nothing recorded, no sleep).
        strict_accept: strict's accepted drafts per round, as a share of N.
    """

    def __init__(
        self,
        cliff: float = 1.0,
        drop: float = 0.5,
        fail_above: float | None = None,
        delay: float = 0.0,
        strict_accept: float = 0.2,
    ):
        self.cliff, self.drop, self.fail_above, self.delay = cliff, drop, fail_above, delay
        self.strict_accept = strict_accept
        self.calls: list[tuple] = []
        self.generated: list[tuple[str, str, str]] = []

    def _record(self, config, problem: Problem) -> dict:
        k = config.knob
        relaxed = config.method != "strict"
        l_accept = config.n_draft * (k / (k + 1) if relaxed and k is not None else self.strict_accept)
        bad_every = int(round(1 / self.drop)) if relaxed and k is not None and k > self.cliff else 0
        correct = not (bad_every and int(problem.id) % bad_every == 0)
        rounds = 10
        return dict(
            problem_id=problem.id,
            repeat=0,
            seed=0,
            failed=False,
            correct=correct,
            verdict="correct" if correct else "wrong",
            output="x",
            finish_reason="stop",
            response_tokens=100,
            stats={"rounds": rounds, "accepted": round(l_accept * rounds), "wall_seconds": 1.0},
            **record_identity(),
        )

    def __call__(self, spec, backend, config, *, output_dir, problems, progress) -> EvalResult:
        self.calls.append((config.method, config.knob, config.n_draft, len(problems), config.seed))
        if self.fail_above is not None and config.knob is not None and config.knob > self.fail_above:
            raise RuntimeError("evaluation exploded")
        path = records_path(Path(output_dir), spec, config, getattr(backend, "name", "synthetic"))
        records = [self._record(config, p) for p in problems]
        if self.delay > 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            with claim(claim_path(path, [p.id for p in problems])):
                self._generate(spec, config, path, records)
        return summarize(records, path)

    def _generate(self, spec, config, path: Path, records: list[dict]) -> None:
        """Sleep ``delay`` per record not in the file yet, then append it (under the claim)."""
        done = set()
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    done.add(json.loads(line)["problem_id"])
                except (json.JSONDecodeError, KeyError):
                    continue  # a line cut by a kill
        with open(path, "ab", buffering=0) as out:
            for record in records:
                if record["problem_id"] not in done:
                    time.sleep(self.delay)
                    out.write((json.dumps(record) + "\n").encode())
                    self.generated.append((spec.name, config.label, record["problem_id"]))


def write_task(folder: str | Path, n_problems: int, name: str = "synthetic") -> str:
    """Write a synthetic task (``<name>.yaml`` and its ``n_problems`` rows) into
    ``folder``; returns the YAML's path (a ``--task`` value)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = (folder / f"{name}.jsonl").resolve()
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(n_problems)))
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nversion: 1\ndataset: {{path: json, data_files: {data}}}\n"
        "grader: {kind: math}\nsampling: {temperature: 0.6}\nmax_new_tokens: 64\n"
    )
    return str(path)


def main(argv: list[str] | None = None) -> int:
    """One worker: the main job (``run_tune_job``) on the synthetic evaluation. Prints
    its log, then one JSON line: ``{"worker", "started", "ended", "cpu", "generated",
    "config"}`` (times in seconds since the epoch, taken after the imports; ``cpu``:
    the CPU seconds the job took, every thread; ``generated``: samples it generated)."""
    ap = argparse.ArgumentParser(description="one synthetic tuning worker")
    ap.add_argument("settings", help="JSON file of TuneSettings fields")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds per new sample")
    ap.add_argument("--cliff", type=float, default=1.0)
    ap.add_argument("--drop", type=float, default=0.5)
    ap.add_argument("--strict-accept", type=float, default=0.2, help="strict's accepted drafts per round / N")
    ap.add_argument("--worker", default=None, help="this worker's label (default host:pid)")
    ap.add_argument(
        "--barrier",
        default=None,
        help="a folder: after the imports, create ready-<worker> there and "
        "start when a file named go appears (workers starting at once)",
    )
    args = ap.parse_args(argv)

    import datasets  # noqa: F401 - what the job imports on first use: part of starting the process,
    import matplotlib.pyplot  # noqa: F401   as the imports above are, not of the job
    import mlflow.data
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import optuna  # noqa: F401
    import scipy.stats  # noqa: F401
    import sqlalchemy  # noqa: F401

    from relaxtune.job.run import run_tune_job
    from relaxtune.report.tracking import Tracker  # noqa: F401
    from relaxtune.tune.point_records import record_identity
    from relaxtune.tune.storage import load_rdb_modules

    load_rdb_modules()  # what Optuna's RDBStorage imports on its first use in a process (its SQL models, alembic)
    record_identity()  # the code identity, computed once per process (source digests): part of starting it
    from relaxtune.job.steps import check_request, guarded_job
    from relaxtune.tune.settings import TuneSettings

    settings = TuneSettings(**json.loads(Path(args.settings).read_text()))
    if args.barrier:
        Path(args.barrier, f"ready-{args.worker}").touch()
        while not Path(args.barrier, "go").exists():
            time.sleep(0.002)
    started, cpu = time.time(), time.process_time()
    log = lambda message: print(f"[{time.time() - started:6.1f} s] {message}", flush=True)  # noqa: E731
    spec = check_request(settings)
    resume = shlex.join([sys.executable, "-m", "relaxtune.testing.synthetic", *(argv or sys.argv[1:])])
    evaluate = Synthetic(args.cliff, args.drop, delay=args.delay, strict_accept=args.strict_accept)
    with guarded_job(settings, spec, SyntheticPair.name, resume, log, exit_now=True):
        config, _ = run_tune_job(
            settings, SyntheticPair(), progress=False, worker=args.worker, evaluate_fn=evaluate, log=log
        )
    print(
        json.dumps(
            {
                "worker": args.worker,
                "started": started,
                "ended": time.time(),
                "cpu": time.process_time() - cpu,
                "generated": len(evaluate.generated),
                "config": config.model_dump(mode="json"),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
