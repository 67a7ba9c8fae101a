"""The MLflow UI as a user opens it: after a small tuning job (the synthetic
evaluation through the real tracker), ``mlflow server`` on loopback and headless
Chromium on the task run's page. MLflow's REST API is the ground truth for the
run's params, metrics, tags and artifacts; the rendered page must show the
decision without opening an artifact. The screenshot stays under the job's
``relaxtune-runs/`` (and in ``$RELAXTUNE_TEST_ARTIFACTS`` when set, for CI).
Skipped, saying why, where Chromium is absent (Debian package ``chromium``,
installed by ``.ci/run``)."""

import html
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from relaxtune.job.run import run_tune_job
from relaxtune.report.decision import decide
from relaxtune.report.tracking import run_url
from relaxtune.tune.settings import TuneSettings

from .synthetic import Synthetic, SyntheticPair, write_task

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--virtual-time-budget=20000",
    "--window-size=1400,2200",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def chromium(profile: Path, *args: str) -> str:
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )
    return out.stdout


@pytest.fixture
def server(tmp_path):
    """Start ``mlflow server`` on a free loopback port against ``tmp_path/mlflow.db``
    (call it once the job ran); stopped, with its process group, at the end."""
    procs = []

    def start(uri: str) -> str:
        port = free_port()
        mlflow = Path(sys.executable).with_name("mlflow")
        log = open(tmp_path / "mlflow-server.log", "w")
        env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        procs.append(
            subprocess.Popen(
                [
                    str(mlflow),
                    "server",
                    "--backend-store-uri",
                    uri,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--workers",
                    "1",
                ],
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                return base
            except OSError:
                if procs[-1].poll() is not None:
                    break
                time.sleep(0.5)
        pytest.fail(f"mlflow server did not answer: {(tmp_path / 'mlflow-server.log').read_text()[-2000:]}")

    yield start
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed (Debian package chromium, which .ci/run "
    "installs as root): the browser check of the MLflow UI needs it",
)
def test_the_task_run_page_shows_the_decision_and_lists_the_figures(tmp_path, monkeypatch, server):
    monkeypatch.chdir(tmp_path)  # the sqlite store's artifacts go under ./mlruns
    runs = tmp_path / "relaxtune-runs"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    s = TuneSettings(
        task=write_task(tmp_path / "task", 24, "browser"),
        methods=["cactus", "mentored"],
        n_drafts=[4],
        trials=4,
        stage_size=24,
        c_rel=0.2,
        epsilon=0.2,
        output_dir=str(runs),
        mlflow_uri=uri,
        confirm="seeds",
    )
    config, _ = run_tune_job(
        s, SyntheticPair(), progress=False, log=lambda m: None, evaluate_fn=Synthetic(cliff=20.0, delay=1e-4)
    )
    decision = decide(config)
    run_id, experiment = config.mlflow["run_id"], config.mlflow["experiment_id"]
    base = server(uri)

    exp = get(f"{base}/api/2.0/mlflow/experiments/get?experiment_id={experiment}")["experiment"]
    assert {"key": "mlflow.experimentKind", "value": "custom_model_development"} in exp["tags"]
    run = get(f"{base}/api/2.0/mlflow/runs/get?run_id={run_id}")["run"]
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert params["recommended_method"] == "cactus" == config.recommendation.method
    assert {k: params[k] for k in decision.params} == decision.params
    assert metrics["recommended_speedup"] == pytest.approx(config.recommendation.modeled_speedup)
    assert metrics["recommended_drop_ucb"] == pytest.approx(config.methods["cactus"].drop_upper_bound)
    assert {"epsilon", "confidence", "n"} <= set(metrics) and tags["relaxtune.recommended"] == decision.label
    assert tags["mlflow.note.content"] == decision.description
    assert run["info"]["run_name"] == f"browser: use {decision.label}" and run["info"]["status"] == "FINISHED"
    listed = {f["path"] for f in get(f"{base}/api/2.0/mlflow/artifacts/list?run_id={run_id}")["files"]}
    listed |= {f["path"] for f in get(f"{base}/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=figures")["files"]}
    assert {
        "pareto_fronts_by_method.png",
        "figures/cactus_pareto_front.png",
        "figures/cactus_speed_vs_delta.png",
        "figures/mentored_pareto_front.png",
        "figures/mentored_speed_vs_alpha.png",
    } <= listed

    page = run_url(base, experiment, run_id)  # the model-training view, as relaxtune prints it
    assert page == f"{base}/#/experiments/{experiment}/runs/{run_id}?workflowType=machine_learning"
    dom = html.unescape(chromium(tmp_path / "profile", "--dump-dom", page))
    assert decision.description in dom and f"browser: use {decision.label}" in dom
    for key in (
        "recommended_method",
        "recommended_n_draft",
        "recommended_speedup",
        "recommended_drop_ucb",
        "recommended_search_drop_ucb",
        "epsilon",
        "confidence",
    ):  # both bounds: confirmation's, search's
        assert key in dom, key
    artifacts = chromium(tmp_path / "profile", "--dump-dom", page.replace("?", "/artifacts?"))
    assert "pareto_fronts_by_method.png" in artifacts and "figures" in artifacts
    shot = runs / "mlflow-task-run.png"
    chromium(tmp_path / "profile", f"--screenshot={shot}", page)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("RELAXTUNE_TEST_ARTIFACTS"):  # CI keeps it
        keep = Path(os.environ["RELAXTUNE_TEST_ARTIFACTS"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / shot.name)
