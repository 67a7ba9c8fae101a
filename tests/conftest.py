"""Shared helpers for the statistical tests: exact goodness-of-fit checks with fixed seeds."""

from __future__ import annotations

import os
import tempfile

# Prefect's test harness: a private home, a generous start-up timeout, no telemetry,
# no external API (set before anything imports prefect).
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="relaxtune-prefect-"))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.pop("PREFECT_API_URL", None)
os.environ.setdefault(
    "MLFLOW_TRACKING_URI", "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="relaxtune-mlflow-"), "mlflow.db")
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RELAXTUNE_ESTIMATES", "off")  # no job of a test keeps its measures in the user's cache

import numpy as np
import pytest
import torch
from scipy import stats

torch.set_num_threads(1)  # tiny models: threads only add overhead (and tests may run beside other work)

P_FLOOR = 1e-4  # a correct sampler passes at this level; the fixed seeds make it deterministic


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of integer ``samples`` against ``probs`` [V],
    pooling cells whose expected count is below 5. A sample in a zero-probability
    cell gives p-value 0."""
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    counts = np.bincount(np.asarray(samples).ravel(), minlength=len(probs)).astype(np.float64)
    n = counts.sum()
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs * n
    big = expected >= 5
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def random_rows(g: torch.Generator, *shape: int, scale: float = 1.5, dtype=torch.float32) -> torch.Tensor:
    """Random probability rows ``[*shape]`` (softmax of scaled Gaussians)."""
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).softmax(-1).to(dtype)


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory):
    """A saved tiny verifier and its noisy-copy drafter, sharing a tokenizer (folders)."""
    from .tiny_models import save_tiny_model

    root = tmp_path_factory.mktemp("models")
    return save_tiny_model(root / "drafter", noise=0.2), save_tiny_model(root / "verifier")


@pytest.fixture(scope="session")
def tiny_backend(tiny_pair_dirs):
    """The tiny saved pair loaded through ``load_pair`` (float32)."""
    from relaxtune.backends.hf import load_pair

    return load_pair(*tiny_pair_dirs, dtype="float32")


# ------------------------------------------------------------------ PostgreSQL

PG_ADMIN = os.environ.get("RELAXTUNE_TEST_PG", "postgresql://rt:rt@127.0.0.1:5432/postgres")


def _pg_reachable() -> str | None:
    """None when the test server answers, else why not."""
    import psycopg

    try:
        psycopg.connect(PG_ADMIN, connect_timeout=3).close()
        return None
    except psycopg.Error as err:
        return str(err).strip().splitlines()[0]


@pytest.fixture(scope="session")
def pg_server():
    """The PostgreSQL 15 server of these machines (``.ci/run`` starts it and creates the
    role ``rt``); skips with the reason when it is not installed or does not answer."""
    import shutil
    import subprocess

    if shutil.which("pg_ctlcluster") is None:
        pytest.skip(
            "PostgreSQL is not installed here (no pg_ctlcluster): the multi-worker PostgreSQL tests need "
            "the Debian package postgresql-15, started by .ci/run"
        )
    why = _pg_reachable()
    if why is not None and os.geteuid() == 0:  # installed but stopped: start it as .ci/run does
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "start"], capture_output=True)
        why = _pg_reachable()
    if why is not None:
        pytest.skip(f"PostgreSQL does not answer at {PG_ADMIN} ({why}): start it and create the role as .ci/run does")
    return PG_ADMIN


@pytest.fixture
def pg_database(pg_server):
    """A fresh database on the test server: a factory ``new(tag) -> SQLAlchemy URL``
    (psycopg 3 driver); every database it made is dropped when the test ends."""
    import uuid

    import psycopg

    made: list[str] = []

    def new(tag: str = "db") -> str:
        name = f"rt_test_{tag}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return pg_server.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0] + f"/{name}"

    yield new
    for name in made:
        _drop_database(pg_server, name)


def _drop_database(admin_url: str, name: str, tries: int = 20) -> None:
    """Drops ``name``, ending its sessions. An autovacuum worker on a fresh database has no
    role, so a role without pg_signal_backend may not end it (``InsufficientPrivilege``,
    PostgreSQL 15's TerminateOtherDBBackends): the worker is short-lived, so try again."""
    import time

    import psycopg

    for attempt in range(tries):
        try:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.errors.InsufficientPrivilege:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)


# ------------------------------------------------------------------ SGLang, live


@pytest.fixture(scope="session")
def live_pair(tmp_path_factory):
    """A real SGLang drafter and verifier server on tiny models, started once per session
    (skips without ``RELAXTUNE_SGLANG_PYTHON``; ``tests/sglang_live.py``)."""
    from .sglang_live import start_live_pair

    with start_live_pair(tmp_path_factory.mktemp("sglang-live")) as pair:
        yield pair


@pytest.fixture
def user_tasks_only(monkeypatch, tmp_path_factory):
    """Hide the packaged task specs (``relaxtune/evals/``): the task search path is then
    only ``$RELAXTUNE_EVALS``, for tests that count the tasks of their own folders."""
    from relaxtune.tasks import spec

    monkeypatch.setattr(spec, "PACKAGED_EVALS", tmp_path_factory.mktemp("no-packaged-tasks"))


def pytest_collection_modifyitems(config, items):
    """Every test on a real PostgreSQL server (it uses ``pg_server``, directly or through
    ``pg_database``) is marked ``postgres``: left out of the default run, run by ``-m postgres``."""
    for item in items:
        if "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
