"""A tuning job's MLflow tracking off its critical path (``relaxtune.report.background``):
calls run in order on one thread of their own, reads wait for them, failures reach the
job; the job's first samples are generated while its MLflow store is being made."""

import sqlite3
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

import relaxtune.report.stores as stores
from relaxtune.job.run import run_tune_job
from relaxtune.report.background import BackgroundTracker
from relaxtune.report.reexport import JobError
from relaxtune.report.stores import StoreError
from relaxtune.tune.settings import TuneSettings
from relaxtune.tune.stopping import guarded

from .synthetic import Synthetic, SyntheticPair, write_task
from .test_stores import _half_migrated


class Recorder:
    """A tracker stand-in: records each call with the thread it ran on."""

    def __init__(self, calls: list, fail_on: str | None = None):
        self.calls, self.fail_on, self.task_run_id = calls, fail_on, "task-run"

    def start_study(self, method, study):
        self.calls.append(("start_study", method, threading.current_thread().name))
        return "study-run"

    def end(self, status):
        self.calls.append(("end", status, threading.current_thread().name))

    def log_trial(self, method, number, *rest, **kw):
        if number == self.fail_on:
            raise RuntimeError(f"tracking server went away at trial {number}")
        time.sleep(0.01)
        self.calls.append(("log_trial", number, threading.current_thread().name))


def test_calls_are_queued_in_order_on_one_thread_and_a_read_waits_for_them():
    calls, gate = [], threading.Event()

    def make():
        gate.wait(10)  # the store is still being made
        return Recorder(calls)

    tracker = BackgroundTracker(make)
    began = time.perf_counter()
    assert tracker.start_study("cactus", None) is None
    for number in range(5):
        assert tracker.log_trial("cactus", number, {}, {}, "COMPLETE", None) is None
    assert time.perf_counter() - began < 1.0 and calls == []  # nothing waited for the store
    gate.set()
    assert tracker.wait().task_run_id == "task-run"  # a read: every queued call has run
    assert [c[:2] for c in calls] == [("start_study", "cactus")] + [("log_trial", n) for n in range(5)]
    threads = {c[2] for c in calls}
    assert len(threads) == 1 and threads != {threading.current_thread().name}
    (name,) = threads
    assert name in {t.name for t in threading.enumerate()}
    tracker.close()  # the job's end: its thread ends too
    assert name not in {t.name for t in threading.enumerate()}


def test_a_failed_call_is_raised_by_the_next_call():
    calls = []
    tracker = BackgroundTracker(lambda: Recorder(calls, fail_on=1))
    tracker.log_trial("cactus", 0, {}, {}, "COMPLETE", None)
    tracker.log_trial("cactus", 1, {}, {}, "COMPLETE", None)
    with pytest.raises(RuntimeError, match="went away at trial 1"):
        tracker.wait()
    tracker.log_trial("cactus", 2, {}, {}, "COMPLETE", None)  # raised once; the next calls run
    assert tracker.wait().task_run_id == "task-run" and [c[1] for c in calls] == [0, 2]

    tracker = BackgroundTracker(lambda: Recorder([], fail_on=0))
    tracker.log_trial("cactus", 0, {}, {}, "COMPLETE", None)
    deadline = time.time() + 10
    with pytest.raises(RuntimeError, match="went away at trial 0"):  # raised by a queued call, not only a read
        while time.time() < deadline:
            tracker.log_trial("cactus", 9, {}, {}, "COMPLETE", None)
            time.sleep(0.01)


def test_a_store_that_cannot_be_made_is_a_job_error_saying_what_to_do():
    def make():
        raise StoreError("MLflow store x is half-migrated: run `mlflow db upgrade x`")

    tracker = BackgroundTracker(make)
    with pytest.raises(JobError, match="mlflow db upgrade"):
        tracker.wait()
    with pytest.raises(JobError, match="mlflow db upgrade"):
        tracker.log_trial("cactus", 0, {}, {}, "COMPLETE", None)  # every later call too


def test_a_stopped_job_waits_for_the_store_then_ends_the_runs(tmp_path):
    """A stop in the middle of MLflow's migration must not exit under it (the store would be
    left half-made): the job waits for the tracker's thread, then ends its runs."""
    calls, said = [], []

    def make():
        time.sleep(1.0)  # migrating
        calls.append(("made", None, threading.current_thread().name))
        return Recorder(calls)

    settings = TuneSettings(task="x.yaml", output_dir=str(tmp_path), storage=f"sqlite:///{tmp_path / 'o.db'}")
    with pytest.raises(SystemExit) as stop:
        with guarded(settings, "x-v1", lambda: [], "relaxtune tune", said.append):
            tracker = BackgroundTracker(make)
            tracker.log_trial("cactus", 0, {}, {}, "COMPLETE", None)
            raise KeyboardInterrupt
    assert stop.value.code == 130 and "stopped (SIGINT)" in said[-1]
    assert [c[:2] for c in calls] == [("made", None), ("log_trial", 0), ("end", "KILLED")]


def _settings(tmp_path, uri: str) -> TuneSettings:
    return TuneSettings(
        task=write_task(tmp_path / "task", 12, "bg"),
        methods=["cactus"],
        n_drafts=[4],
        trials=3,
        stage_size=12,
        c_rel=0.2,
        output_dir=str(tmp_path / "runs"),
        mlflow_uri=uri,
        confirm="seeds",
    )


@pytest.mark.slow
def test_the_first_samples_are_generated_while_the_mlflow_store_is_made(tmp_path, monkeypatch):
    """The store's making waits for the first generated sample: a job that made the store
    before generating would wait the whole 30 s and fail here."""
    order, sampled = [], threading.Event()
    real = stores.prepare_mlflow

    def slow_store(uri, log):
        if not sampled.wait(30):
            raise StoreError("the store was made before any sample: it holds the job")
        order.append("store")
        real(uri, log)

    class FirstSample(Synthetic):
        def __call__(self, *args, **kwargs):
            if not sampled.is_set():
                order.append("sample")
                sampled.set()
            return super().__call__(*args, **kwargs)

    monkeypatch.setattr(stores, "prepare_mlflow", slow_store)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = {t for t in threading.enumerate() if t.name.startswith("mlflow")}
    config, _ = run_tune_job(
        _settings(tmp_path, uri),
        SyntheticPair(),
        progress=False,
        log=lambda m: None,
        evaluate_fn=FirstSample(cliff=20.0, delay=1e-4),
    )
    assert {t for t in threading.enumerate() if t.name.startswith("mlflow")} - before == set()  # its thread ended
    assert order[:2] == ["sample", "store"]  # (the Tracker checks the store again: made, it returns)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("relaxtune-bg").experiment_id])
    kinds = sorted(r.data.tags["relaxtune.kind"] for r in runs)
    assert kinds == ["study", "task", "trial", "trial", "trial"]  # every call queued before the store ran
    assert config.methods["cactus"].mlflow_run_id == next(
        r.info.run_id for r in runs if r.data.tags["relaxtune.kind"] == "study"
    )


@pytest.mark.slow
def test_a_half_migrated_store_with_runs_stops_the_job_saying_what_to_do(tmp_path):
    uri = _half_migrated(tmp_path / "mlflow.db", runs=2)
    before = (tmp_path / "mlflow.db").read_bytes()
    evaluate = Synthetic(cliff=20.0, delay=1e-4)
    with pytest.raises(JobError, match=r"holds 2 run\(s\).*mlflow db upgrade"):
        run_tune_job(
            _settings(tmp_path, uri), SyntheticPair(), progress=False, log=lambda m: None, evaluate_fn=evaluate
        )
    assert (tmp_path / "mlflow.db").read_bytes() == before
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (2,)


@pytest.mark.slow
def test_a_wrong_tracking_server_fails_before_any_sample(tmp_path, monkeypatch):
    """A tracking server has nothing to migrate: the job waits for its tracker, so a wrong
    address ends the job before the first sample (not after a trial's worth of generation).
    The "server" here takes connections and never answers: MLflow's request times out. The
    job's first check of its stores (``reach_tracking``, tested in test_store_uris) is passed
    over, as for a server that stops answering just after it."""
    import socket

    import relaxtune.job.steps

    monkeypatch.setattr(relaxtune.job.steps, "reach_tracking", lambda *a, **k: None)

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshakes; nobody reads or answers
    port = silent.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")  # longer than the job takes to its first sample
    evaluate = Synthetic(cliff=20.0, delay=1e-4)
    try:
        with pytest.raises(Exception, match=f"127.0.0.1.*{port}"):
            run_tune_job(
                _settings(tmp_path, f"http://127.0.0.1:{port}"),
                SyntheticPair(),
                progress=False,
                log=lambda m: None,
                evaluate_fn=evaluate,
            )
    finally:
        silent.close()
    assert evaluate.calls == []


def test_a_failure_is_raised_once_when_trial_lanes_call_at_the_same_moment():
    """Trial lanes (threads) call the tracker at once after a queued call failed: exactly one
    of them gets the failure, the others go on (none gets an error of the bookkeeping)."""
    import sys

    class Failing:
        def log_trial(self, method, number, *rest):
            if number == 0:
                raise RuntimeError("tracking server went away")

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: the race shows within a few hundred tries
    try:
        for _ in range(300):
            tracker = BackgroundTracker(Failing)
            tracker.log_trial("cactus", 0)
            deadline = time.time() + 10
            while not tracker._queued[0].done() and time.time() < deadline:  # failed, not yet raised
                time.sleep(0.001)
            said, start = [], threading.Barrier(8)

            def lane():
                start.wait()
                try:
                    tracker.log_trial("cactus", 1)
                    said.append("ok")
                except Exception as err:
                    said.append(f"{type(err).__name__}: {err}")

            lanes = [threading.Thread(target=lane) for _ in range(8)]
            for t in lanes:
                t.start()
            for t in lanes:
                t.join()
            assert sorted(said) == ["RuntimeError: tracking server went away"] + ["ok"] * 7, said
            tracker.close()
    finally:
        sys.setswitchinterval(interval)
