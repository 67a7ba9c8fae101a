"""Many workers on one study, for real: worker processes on a PostgreSQL storage,
a shared MLflow tracking server on a PostgreSQL backend store, one worker killed
with SIGKILL in the middle of a trial."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from relaxtune.job.run import run_tune_job
from relaxtune.tune.settings import TuneSettings

from .synthetic import Synthetic, SyntheticPair, write_task

ROOT = Path(__file__).parents[1]
ENV = os.environ | {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}
GRID = {
    "cactus": [0.25, 1.0, 10.0],
    "mentored": [0.3, 0.7, 0.95],
}  # the first three of each paper grid, strongest first


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(pg_database, tmp_path):
    """``mlflow server`` on a PostgreSQL backend store (what many workers share); its URL."""
    port = _free_port()
    log = open(tmp_path / "mlflow-server.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            pg_database("mlflow"),
            "--artifacts-destination",
            str(tmp_path / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=ENV,
        cwd=tmp_path,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.time() + 180
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "mlflow-server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def _running(storage, names: list[str]) -> list[tuple[str, optuna.trial.FrozenTrial]]:
    """(study name, trial) of every RUNNING trial."""
    out = []
    for name in names:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:  # not created yet
            continue
        out += [(name, t) for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]
    return out


def test_three_workers_share_a_study_on_postgresql_and_one_is_killed(pg_database, mlflow_server, tmp_path):
    storage = pg_database("optuna")
    task = write_task(tmp_path / "task", 24)
    settings = dict(
        task=task,
        methods=["cactus", "mentored"],
        n_drafts=[4],
        trials=3,
        stage_size=8,
        range_size=8,
        c_rel=0.2,
        epsilon=0.2,
        heartbeat=1,
        grace_period=3,
        output_dir=str(tmp_path / "runs"),
        storage=storage,
        mlflow_uri=mlflow_server,
        confirm="seeds",
    )
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    names = [f"synthetic__{m}__synthetic-pair" for m in settings["methods"]]
    workers = {}
    for label in ("w0", "w1", "w2"):
        out = open(tmp_path / f"{label}.log", "w")
        cmd = [
            sys.executable,
            "-m",
            "relaxtune.testing.synthetic",
            str(tmp_path / "settings.json"),
            "--delay",
            "0.2",
            "--cliff",
            "0.8",
            "--strict-accept",
            "0.1",
            "--worker",
            label,
        ]
        workers[label] = (
            subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT, start_new_session=True),
            out,
        )
    watch = optuna.storages.RDBStorage(storage)  # one engine for every look (each URL load would open a pool)
    try:
        deadline = time.time() + 180
        victim = None
        while victim is None:  # the first long trial seen running for half a second: kill its worker
            ended = [label for label, (p, _) in workers.items() if p.poll() is not None]
            assert time.time() < deadline and not ended, f"no long trial seen running; ended: {ended}; " + " | ".join(
                (tmp_path / f"{label}.log").read_text()[-1500:] for label in ended
            )
            for name, t in _running(watch, names):
                # feasible: all 24 problems, about 4.8 s, long enough for a watcher on a busy machine
                long = t.params.get("knob") in (0.25, 0.3, 0.7)
                if long and time.time() - t.datetime_start.timestamp() > 0.5 and t.user_attrs.get("worker") in workers:
                    killed_study, victim = name, t
                    break
            time.sleep(0.1)
        label = victim.user_attrs["worker"]
        os.killpg(workers[label][0].pid, signal.SIGKILL)
        reports = {}
        for other, (proc, out) in workers.items():
            if other != label:
                assert proc.wait(timeout=240) == 0, (tmp_path / f"{other}.log").read_text()[-3000:]
                reports[other] = json.loads((tmp_path / f"{other}.log").read_text().strip().splitlines()[-1])
    finally:
        for proc, out in workers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out.close()

    # exactly --trials finished per study, every grid point once, the killed trial retried once
    trials = {}
    for name in names:
        study = optuna.load_study(study_name=name, storage=watch)
        trials[name] = study.get_trials(deepcopy=False)
        done = [t for t in trials[name] if t.state.name in ("COMPLETE", "PRUNED")]
        method = name.split("__")[1]
        assert sorted(t.params["knob"] for t in done) == GRID[method], [(t.number, t.state.name) for t in trials[name]]
        assert not [t for t in trials[name] if t.state.name in ("RUNNING", "WAITING")]
    killed = trials[killed_study][victim.number]
    assert killed.state.name == "FAIL" and killed.user_attrs["worker"] == label
    retries = [t for name in names for t in trials[name] if t.system_attrs.get("failed_trial") is not None]
    assert len(retries) == 1 and retries[0] in trials[killed_study]
    assert retries[0].system_attrs["failed_trial"] == victim.number and retries[0].params == killed.params
    assert retries[0].state.name in ("COMPLETE", "PRUNED") and retries[0].user_attrs["worker"] != label
    assert sum(t.state.name == "FAIL" for name in names for t in trials[name]) == 1

    # MLflow: one run per trial (the killed one logged as failed by who found it stale), one job
    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("relaxtune-synthetic").experiment_id])
    trial_runs = [
        (r.data.tags["relaxtune.study"], int(r.data.tags["relaxtune.trial"]), r.data.tags["relaxtune.state"])
        for r in runs
        if r.data.tags.get("relaxtune.kind") == "trial"
    ]
    assert sorted(trial_runs) == sorted((n, t.number, t.state.name) for n in names for t in trials[n])
    assert len({r.data.tags["relaxtune.job"] for r in runs}) == 1
    assert sorted(r.data.tags["relaxtune.kind"] for r in runs).count("study") == 2

    # every worker exported the same config, and a single worker choosing among the same trials agrees
    configs = [{k: v for k, v in r["config"].items() if k != "created"} for r in reports.values()]
    assert configs[0] == configs[1]
    alone = TuneSettings(**settings | {"storage": None, "output_dir": str(tmp_path / "alone"), "mlflow_uri": None})
    single, _ = run_tune_job(
        alone,
        SyntheticPair(),
        progress=False,
        track=False,
        log=lambda m: None,
        evaluate_fn=Synthetic(cliff=0.8, strict_accept=0.1),
    )
    single = single.model_dump(mode="json")

    def same_points(result: dict) -> dict:
        """A method's result without what a retry renumbers (the killed trial's retry is a new trial)."""
        out = {k: v for k, v in result.items() if k not in ("failed", "mlflow_run_id", "trial")}
        attempts = [{k: v for k, v in a.items() if k != "trial"} for a in out["confirmation"]["attempts"]]
        return out | {"confirmation": out["confirmation"] | {"attempts": attempts}}

    for method in settings["methods"]:
        mine, theirs = same_points(configs[0]["methods"][method]), same_points(single["methods"][method])
        assert mine == theirs and mine["knob"] == {"cactus": 0.25, "mentored": 0.7}[method]
    assert configs[0]["recommendation"] == single["recommendation"]
    watch.engine.dispose()
