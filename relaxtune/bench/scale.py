"""Wall time of one fixed tuning job run by 1, 2 and 4 workers sharing its studies.

    python -m relaxtune.bench.scale [--workers 1,2,4] [--repeats 2] [--problems 32]
                                    [--trials 12] [--delay 0.25] [--storage URL] [--quick] [--json PATH]

Each run starts W worker processes (``python -m relaxtune.testing.synthetic``) and,
once every one has imported, sets them going at the same instant (as W hosts
started together would be: on this machine's cores, 4 processes importing at
once would otherwise start seconds apart), on a fresh copy of the same job: the
synthetic evaluation, whose cost per sample is a sleep of ``--delay`` seconds
(it occupies no CPU, so this 2-core machine hosts 4 workers the way 4 GPU hosts
would: what is measured is the coordination overhead), methods cactus and
mentored with ``--trials`` trials each, stages and pruning, strict shared by
problem ranges (claimed: each range generated once), MLflow tracking on fresh
stores that the workers create themselves (as a user's workers would:
``relaxtune.report.stores``), the tuned config exported by every worker (its
figures drawn once). Reported per W, as the median of ``--repeats`` runs with
their range: the job's wall time (from the instant the workers start, after
their imports, to the last worker's end) and the processes' wall time (launch
to exit, imports included), each as a ratio to one worker, the seconds of samples
and the CPU seconds of each worker's job (the part the cores share), which trials
each worker ran, and whether every worker exported the same config. Target (issue
24): 4 workers within 0.30 of one worker's job time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from relaxtune.bench.results import Recorder, add_json_option

TARGET = 0.30  # 4 workers' job wall time over one worker's


def _run(workers: int, root: Path, args, name: str, mlflow_uri: str) -> dict:
    """One run of the job by ``workers`` processes; their timings and configs."""
    from relaxtune.testing.synthetic import write_task

    folder = root / name
    settings = dict(
        task=write_task(folder, args.problems, name),
        methods=["cactus", "mentored"],
        n_drafts=[4],
        trials=args.trials,
        stage_size=_stage(args),
        range_size=_range(args),
        c_rel=0.2,
        output_dir=str(folder / "runs"),
        mlflow_uri=mlflow_uri,
        heartbeat=2,
        grace_period=10,
        storage=args.storage or f"sqlite:///{folder / 'optuna.db'}",
    )
    (folder / "settings.json").write_text(json.dumps(settings))
    cmd = [
        sys.executable,
        "-m",
        "relaxtune.testing.synthetic",
        str(folder / "settings.json"),
        "--delay",
        str(args.delay),
        "--cliff",
        "0.8",
    ]
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH")]))
    }
    launched = time.time()
    procs = []
    for i in range(workers):
        out = open(folder / f"worker{i}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    cmd + ["--worker", f"w{i}", "--barrier", str(folder)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                ),
                out,
            )
        )
    try:
        _start_together(procs, folder, workers, time.time() + args.timeout)
        for proc, out in procs:
            proc.wait(timeout=args.timeout)
            out.close()
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    exited = time.time()
    reports = []
    for i, (proc, _) in enumerate(procs):
        log = (folder / f"worker{i}.log").read_text()
        if proc.returncode != 0:
            raise RuntimeError(f"worker {i} of the {workers}-worker run failed ({proc.returncode}):\n{log[-3000:]}")
        reports.append(json.loads(log.strip().splitlines()[-1]))
    configs = [{k: v for k, v in r["config"].items() if k != "created"} for r in reports]
    ran = Counter()
    import optuna

    for method in settings["methods"]:
        study = optuna.load_study(study_name=f"{name}__{method}__synthetic-pair", storage=settings["storage"])
        ran.update(t.user_attrs.get("worker", "?") for t in study.trials if t.state.name in ("COMPLETE", "PRUNED"))
    return {
        "job": max(r["ended"] for r in reports) - min(r["started"] for r in reports),
        "process": exited - launched,
        "agree": all(c == configs[0] for c in configs),
        "cpu": statistics.mean(r["cpu"] for r in reports),
        "samples": statistics.mean(r["generated"] for r in reports) * args.delay,
        "ran": dict(sorted(ran.items())),
        "trials": {m: r["trials"] for m, r in reports[0]["config"]["methods"].items()},
    }


def _start_together(procs: list, folder: Path, workers: int, deadline: float) -> None:
    """Wait until every worker has imported (``ready-w<i>``), then start them at one instant (``go``)."""
    while not all((folder / f"ready-w{i}").exists() for i in range(workers)):
        ended = [i for i, (proc, _) in enumerate(procs) if proc.poll() is not None]
        if ended or time.time() > deadline:
            log = (folder / f"worker{ended[0]}.log").read_text()[-3000:] if ended else ""
            raise RuntimeError(
                f"worker {ended[0]} ended before the start:\n{log}" if ended else "workers not ready in time"
            )
        time.sleep(0.02)
    (folder / "go").touch()


def _stage(args) -> int:
    return max(1, args.problems // 3)


def _range(args) -> int:
    return max(1, args.problems // 8)


def _spread(values: list[float]) -> str:
    med = statistics.median(values)
    return f"{med:7.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4", help="worker counts, comma separated")
    ap.add_argument("--repeats", type=int, default=2, help="runs per worker count (median and range reported)")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--trials", type=int, default=12, help="trials per method")
    ap.add_argument("--delay", type=float, default=0.25, help="seconds per generated sample")
    ap.add_argument("--storage", default=None, help="Optuna storage URL (default: a fresh SQLite file per run)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    ap.add_argument("--quick", action="store_true", help="16 problems, 4 trials, 0.05 s per sample, one repeat")
    add_json_option(ap)
    args = ap.parse_args(argv)
    rec = Recorder("scale", "One tuning job run by several workers", argv)
    if args.quick:
        args.problems, args.trials, args.delay, args.repeats = 16, 4, 0.05, 1
    counts = [int(w) for w in args.workers.split(",")]

    root = Path(tempfile.mkdtemp(prefix="relaxtune-scale-"))
    stamp = int(time.time())
    print(
        f"scale: 2 methods x {args.trials} trials, {args.problems} problems x {args.delay:g} s per sample "
        f"(a sleep), stages of {_stage(args)}, ranges of {_range(args)}; storage "
        f"{'SQLite' if not args.storage else args.storage.split(':')[0]}; {args.repeats} repeat(s); {os.cpu_count()} "
        f"CPU cores shared with whatever else runs (load average {os.getloadavg()[0]:.1f}); work in {root}",
        flush=True,
    )
    runs: dict[int, list[dict]] = {w: [] for w in counts}
    for r in range(args.repeats):  # interleaved, so slow phases of the machine spread over every count
        for w in counts:
            name = f"scale{stamp}_w{w}_r{r}"
            runs[w].append(_run(w, root, args, name, f"sqlite:///{root / name / 'mlflow.db'}"))
            print(f"  run {r + 1}/{args.repeats}, {w} worker(s): job {runs[w][-1]['job']:.1f} s", flush=True)
    base_job = statistics.median(x["job"] for x in runs[counts[0]])
    base_proc = statistics.median(x["process"] for x in runs[counts[0]])
    print(
        f"\n{'workers':>7} {'job wall s (range)':>20} {'ratio':>6} {'process wall s (range)':>24} {'ratio':>6}  "
        f"{'samples s':>9} {'CPU s':>6}  {'configs agree':>13}  trials finished per worker"
    )
    rows = []
    for w in counts:
        job, proc = [x["job"] for x in runs[w]], [x["process"] for x in runs[w]]
        agree = all(x["agree"] for x in runs[w])
        samples, cpu = (statistics.median(x[k] for x in runs[w]) for k in ("samples", "cpu"))
        print(
            f"{w:>7} {_spread(job):>20} {statistics.median(job) / base_job:>6.2f} {_spread(proc):>24} "
            f"{statistics.median(proc) / base_proc:>6.2f}  {samples:>9.1f} {cpu:>6.1f}  "
            f"{'yes' if agree else 'NO':>13}  "
            f"{runs[w][-1]['ran']}"
        )
        rows.append(
            [
                w,
                _spread(job).strip(),
                round(statistics.median(job) / base_job, 2),
                _spread(proc).strip(),
                round(statistics.median(proc) / base_proc, 2),
                round(samples, 1),
                round(cpu, 1),
                "yes" if agree else "NO",
            ]
        )
    print(
        "samples s: seconds of samples (sleeps) per worker; CPU s: the CPU seconds each worker's job took (every "
        f"thread), which {os.cpu_count()} cores share"
    )
    jobs = {w: [x["job"] for x in runs[w]] for w in counts}
    noisy = [w for w in counts if (max(jobs[w]) - min(jobs[w])) / statistics.median(jobs[w]) > 0.1]
    notes = []
    if noisy:
        notes.append(f"noisy: job times of {', '.join(map(str, noisy))} worker(s) spread over 10 % between repeats")
        print(notes[-1])
    if 4 in runs and counts[0] == 1:
        ratio = statistics.median(x["job"] for x in runs[4]) / base_job
        verdict = "met" if ratio <= TARGET else "MISSED"
        notes.append(f"4 workers / 1 worker (job wall time): {ratio:.2f}, target <= {TARGET}: {verdict}")
        print(f"{notes[-1]}; load average now {os.getloadavg()[0]:.1f}")
    rec.table(
        f"scale: 2 methods x {args.trials} trials, {args.problems} problems x {args.delay:g} s per sample, "
        f"median (range) of {args.repeats} repeat(s)",
        ["workers", "job wall s (range)", "ratio", "process wall s (range)", "ratio"]
        + ["samples s", "CPU s", "configs agree"],
        rows,
        notes,
        show=False,
    )
    rec.write(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
