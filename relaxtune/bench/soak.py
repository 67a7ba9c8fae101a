"""Soak test: many workers from a cold start, one killed, the job still right.

    python -m relaxtune.bench.soak [--rounds 20] [--trials 3] [--problems 12] [--delay 0.03]
                                   [--postgres ADMIN_URL] [--seed 0] [--json PATH]

Each round starts 2-4 worker processes (``python -m relaxtune.testing.synthetic``,
the synthetic evaluation: a sleep of ``--delay`` s per new sample) at the same
instant, after their imports, on stores that do not exist yet: a fresh SQLite
Optuna storage and MLflow store (with ``--postgres``, every other round on two
fresh PostgreSQL databases instead). One of them is killed with SIGKILL at a
random moment of the job and a new worker is started in its place; the
survivors and the new worker finish the job. Checked and printed per round and
in total: no worker failed but the killed one; both stores usable (MLflow's at
its newest schema, every study loadable); exactly ``--trials`` finished trials
per study and none left running or waiting; one MLflow run per trial; no sample
generated twice (no record written twice in any records file); every worker's
exported config identical. Exit status 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from relaxtune.bench.results import Recorder, add_json_option

METHODS = ["cactus", "mentored"]


def _env() -> dict:
    root = str(Path(__file__).parents[2])
    return os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }


def _start(folder: Path, label: str, args, barrier: bool) -> tuple[subprocess.Popen, object]:
    cmd = [
        sys.executable,
        "-m",
        "relaxtune.testing.synthetic",
        str(folder / "settings.json"),
        "--delay",
        str(args.delay),
        "--cliff",
        "0.8",
        "--strict-accept",
        "0.1",
        "--worker",
        label,
    ]
    if barrier:
        cmd += ["--barrier", str(folder)]
    out = open(folder / f"{label}.log", "w")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True), out


def _stop(procs: dict) -> None:
    for proc, out in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        out.close()


def _pg_databases(admin: str, n: int) -> list[str]:
    import psycopg

    names = [f"rt_soak_{uuid.uuid4().hex[:8]}" for _ in range(n)]
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0]
    return [f"{base}/{name}" for name in names]


def _drop_pg(admin: str, urls: list[str]) -> None:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        for url in urls:
            conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def run_round(k: int, root: Path, args, rng: random.Random, postgres: bool) -> dict:
    """One round (module doc); its counts and the failed checks (``failures``)."""
    import optuna
    from mlflow.tracking import MlflowClient

    from relaxtune.report.stores import mlflow_state
    from relaxtune.testing.synthetic import write_task

    folder = root / f"round{k:02d}"
    folder.mkdir(parents=True)
    pg = _pg_databases(args.postgres, 2) if postgres else []
    storage, mlflow_uri = pg or (f"sqlite:///{folder / 'optuna.db'}", f"sqlite:///{folder / 'mlflow.db'}")
    settings = dict(
        task=write_task(folder / "task", args.problems),
        methods=METHODS,
        n_drafts=[4],
        trials=args.trials,
        stage_size=max(1, args.problems // 2),
        range_size=max(1, args.problems // 4),
        c_rel=0.2,
        epsilon=0.2,
        heartbeat=1,
        grace_period=3,
        output_dir=str(folder / "runs"),
        storage=storage,
        mlflow_uri=mlflow_uri,
    )
    (folder / "settings.json").write_text(json.dumps(settings))
    n = rng.randint(2, 4)
    victim, kill_after = f"w{rng.randrange(n)}", rng.uniform(0.0, args.kill_window)
    procs = {f"w{i}": _start(folder, f"w{i}", args, True) for i in range(n)}
    failures, began = [], time.time()
    try:
        deadline = time.time() + args.timeout
        while not all((folder / f"ready-{label}").exists() for label in procs):
            ended = [label for label, (p, _) in procs.items() if p.poll() is not None]
            if ended or time.time() > deadline:
                raise RuntimeError(
                    f"workers {ended} ended before the start: " + (folder / f"{ended[0]}.log").read_text()[-2000:]
                    if ended
                    else "workers not ready in time"
                )
            time.sleep(0.05)
        (folder / "go").touch()
        go = time.time()
        time.sleep(kill_after)
        killed_while = "running" if procs[victim][0].poll() is None else "already finished"
        try:
            os.killpg(procs[victim][0].pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended before the kill, and its whole group with it
            pass
        procs["restarted"] = _start(folder, "restarted", args, False)
        reports = {}
        for label, (proc, _) in procs.items():
            if label == victim:
                continue
            rc = proc.wait(timeout=max(1.0, deadline - time.time()))
            log = (folder / f"{label}.log").read_text()
            if rc != 0:
                failures.append(f"worker {label} failed ({rc}): {log[-1500:]}")
            else:
                reports[label] = json.loads(log.strip().splitlines()[-1])
        job = time.time() - go
    finally:
        _stop(procs)

    # the stores, the studies, the runs, the records, the configs
    try:
        if not mlflow_state(mlflow_uri)["complete"]:
            failures.append("MLflow store not at its newest schema")
        names = [f"synthetic__{m}__synthetic-pair" for m in METHODS]
        studies = {
            name: optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False) for name in names
        }
        finished = {
            name: sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) for name, trials in studies.items()
        }
        left = sum(t.state.name in ("RUNNING", "WAITING") for trials in studies.values() for t in trials)
        if set(finished.values()) != {args.trials} or left:
            failures.append(f"finished trials per study {finished}, {left} running or waiting (want {args.trials})")
        client = MlflowClient(mlflow_uri)
        runs = client.search_runs([client.get_experiment_by_name("relaxtune-synthetic").experiment_id])
        per_trial = Counter(
            (r.data.tags["relaxtune.study"], int(r.data.tags["relaxtune.trial"]))
            for r in runs
            if r.data.tags.get("relaxtune.kind") == "trial"
        )
        ended = {
            (name, t.number)
            for name, trials in studies.items()
            for t in trials
            if t.state.name in ("COMPLETE", "PRUNED", "FAIL")
        }
        if set(per_trial) != ended or max(per_trial.values(), default=1) != 1:
            failures.append(f"MLflow trial runs {sorted(per_trial.items())} vs ended trials {sorted(ended)}")
    except Exception as err:
        failures.append(f"stores not usable: {type(err).__name__}: {err}")
        per_trial = Counter()
    written, twice = 0, 0
    for path in (folder / "runs").rglob("*.jsonl"):
        keys = Counter((r["problem_id"], r.get("repeat", 0)) for r in map(json.loads, path.read_text().splitlines()))
        written += sum(keys.values())
        twice += sum(c - 1 for c in keys.values())
    if twice:
        failures.append(f"{twice} sample(s) generated twice")
    configs = [
        json.dumps({k: v for k, v in r["config"].items() if k != "created"}, sort_keys=True) for r in reports.values()
    ]
    if len(set(configs)) != 1:
        failures.append(f"exported configs differ among {sorted(reports)}")
    if pg:
        from sqlalchemy.engine import make_url  # noqa: F401 - pools of this process closed before the drop

        _drop_pg(args.postgres, pg)
    return {
        "round": k,
        "store": "PostgreSQL" if postgres else "SQLite",
        "workers": n,
        "killed": victim,
        "kill_after": kill_after,
        "killed_while": killed_while,
        "job": job,
        "wall": time.time() - began,
        "runs": sum(per_trial.values()),
        "samples": written,
        "twice": twice,
        "configs": len(reports),
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--trials", type=int, default=3, help="trials per study")
    ap.add_argument("--problems", type=int, default=12)
    ap.add_argument("--delay", type=float, default=0.03, help="seconds per generated sample")
    ap.add_argument("--kill-window", type=float, default=8.0, help="the kill comes within this many s of the start")
    ap.add_argument("--postgres", default=None, help="admin URL of a PostgreSQL server: every other round on it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600, help="seconds one round may take")
    add_json_option(ap)
    args = ap.parse_args(argv)
    rec = Recorder("soak", "Soak: many workers from a cold start, one killed", argv)
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="relaxtune-soak-"))
    print(
        f"soak: {args.rounds} rounds of 2-4 workers started at once on fresh stores, one SIGKILLed within "
        f"{args.kill_window:g} s and one restarted; {len(METHODS)} studies x {args.trials} trials, "
        f"{args.problems} problems x {args.delay:g} s; {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f}; work in {root}",
        flush=True,
    )
    print(
        f"{'round':>5} {'store':>10} {'workers':>7} {'killed at':>14} {'job s':>6} {'runs':>4} {'samples':>7} "
        f"{'twice':>5} {'configs':>7}  checks",
        flush=True,
    )
    rounds = []
    for k in range(args.rounds):
        r = run_round(k, root, args, rng, bool(args.postgres) and k % 2 == 1)
        rounds.append(r)
        killed = f"{r['killed']} {r['kill_after']:.1f}s" + ("" if r["killed_while"] == "running" else "*")
        print(
            f"{k:>5} {r['store']:>10} {r['workers']:>7} {killed:>14} {r['job']:>6.1f} {r['runs']:>4} "
            f"{r['samples']:>7} {r['twice']:>5} {r['configs']:>7}  "
            + ("ok" if not r["failures"] else "FAILED: " + " | ".join(r["failures"])),
            flush=True,
        )
    failed = [r for r in rounds if r["failures"]]
    total = (
        f"total: {len(rounds)} rounds, {sum(r['workers'] for r in rounds)} workers started at once "
        f"+ {len(rounds)} restarted, {len(rounds)} killed ({sum(r['killed_while'] != 'running' for r in rounds)} "
        f"after they had finished: *), {sum(r['runs'] for r in rounds)} MLflow trial runs, "
        f"{sum(r['samples'] for r in rounds)} samples, {sum(r['twice'] for r in rounds)} generated twice, "
        f"{len(failed)} round(s) failed"
    )
    print(f"{total}; load average now {os.getloadavg()[0]:.1f}")
    rec.table(
        f"soak: {args.rounds} rounds, {len(METHODS)} studies x {args.trials} trials, {args.problems} problems x "
        f"{args.delay:g} s per sample",
        ["round", "store", "workers", "killed at s", "job s", "runs", "samples", "twice", "configs", "checks"],
        [
            [
                r["round"],
                r["store"],
                r["workers"],
                round(r["kill_after"], 1),
                round(r["job"], 1),
                r["runs"],
                r["samples"],
                r["twice"],
                r["configs"],
                "ok" if not r["failures"] else "FAILED",
            ]
            for r in rounds
        ],
        [total],
        show=False,
    )
    rec.write(args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
