"""A job stopped by Ctrl-C (SIGINT) or SIGTERM says what it kept and resumes at once;
a job that fails on a full disk says so in one paragraph and logs its traceback."""

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from relaxtune.testing.synthetic import Synthetic, SyntheticPair, write_task
from relaxtune.tune.settings import TuneSettings
from relaxtune.tune.stopping import diagnose, guarded

ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(ROOT)}


def trials_attrs(storage: str, name: str) -> str:
    """Every trial's user attributes as one string (a stale retry leaves its mark there)."""
    return json.dumps([t.user_attrs for t in optuna.load_study(study_name=name, storage=storage).trials], default=str)


def _records(runs: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().splitlines() for p in sorted(runs.rglob("*.jsonl"))}


def _runs(mlflow_uri: str) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "relaxtune-synthetic"]
    return {
        r.data.tags["relaxtune.kind"]: r.info.status
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags["relaxtune.kind"] in ("task", "study")
    }


@pytest.mark.interrupts
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_job_says_what_it_kept_and_resumes_without_waiting(tmp_path, sig):
    runs = tmp_path / "runs"
    settings = dict(
        task=write_task(tmp_path / "task", 8),
        methods=["cactus"],
        n_drafts=[4],
        trials=2,
        stage_size=4,
        confirm="seeds",
        c_rel=0.2,
        epsilon=0.2,
        heartbeat=30,
        grace_period=600,
        output_dir=str(runs),
        storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        mlflow_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    cmd = [sys.executable, "-m", "relaxtune.testing.synthetic", str(tmp_path / "settings.json"), "--delay", "0.3"]
    with open(tmp_path / "first.log", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT, start_new_session=True)
        try:
            deadline = time.time() + 240
            while not any(len(lines) >= 2 for name, lines in _records(runs).items() if name.startswith("cactus")):
                assert proc.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()
                time.sleep(0.1)
            proc.send_signal(sig)
            asked = time.time()
            rc = proc.wait(timeout=60)
            took = time.time() - asked
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    said = (tmp_path / "first.log").read_text()
    # about a second on an idle machine; the bound leaves room for a machine at load 30 on 2 cores
    assert rc == 130 and took < 30, (rc, took, said)
    assert "Traceback" not in said, said
    last = said.strip().splitlines()[-1]
    kept = _records(runs)
    samples = sum(len({json.loads(line)["problem_id"] for line in lines}) for lines in kept.values())
    assert f"stopped ({sig.name}) after " in last and f"Kept: {samples} samples in {len(kept)} record files" in last
    assert "trials finished: cactus 0" in last and last.endswith(f"Resume with: {' '.join(cmd)}")
    assert "cactus trial 0 goes back to its queue (stopped): the resume runs it first" in said
    (name,) = optuna.get_all_study_names(settings["storage"])
    (trial,) = [t for t in optuna.load_study(study_name=name, storage=settings["storage"]).trials if t.number == 0]
    assert trial.state.name == "WAITING" and trial.user_attrs["requeued"].startswith("stopped on ")
    assert _runs(settings["mlflow_uri"]) == {"task": "KILLED", "study": "KILLED"}

    started = time.time()
    resumed = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert time.time() - started < 400, resumed.stdout  # the grace period is 600 s: a stale wait would show
    assert "went stale" not in resumed.stdout and "stale" not in trials_attrs(settings["storage"], name)
    trials = optuna.load_study(study_name=name, storage=settings["storage"]).trials
    assert [t.state.name for t in trials] in (
        ["COMPLETE", "COMPLETE"],
        ["COMPLETE", "PRUNED"],
        ["PRUNED", "PRUNED"],
        ["PRUNED", "COMPLETE"],
    )
    assert trials[0].params == trial.params  # the interrupted trial ran again, the same point
    after = _records(runs)
    for file, lines in kept.items():  # nothing lost: every record kept is still there, in place
        assert after[file][: len(lines)] == lines
    for file, lines in after.items():  # nothing generated twice
        ids = [json.loads(line)["problem_id"] for line in lines]
        assert len(ids) == len(set(ids)), file
    assert _runs(settings["mlflow_uri"]) == {"task": "FINISHED", "study": "FINISHED"}


class FullDisk(Synthetic):
    """The synthetic evaluation on a disk that fills after ``room`` samples."""

    def __init__(self, room: int, **kw) -> None:
        super().__init__(delay=0.001, **kw)
        self.room = room

    def __call__(self, spec, backend, config, *, output_dir, problems, progress):
        if len(self.generated) + len(problems) > self.room:
            path = Path(output_dir) / "x.jsonl"
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return super().__call__(spec, backend, config, output_dir=output_dir, problems=problems, progress=progress)


@pytest.mark.interrupts
def test_a_full_disk_ends_in_one_paragraph_and_a_logged_traceback(tmp_path):
    from relaxtune.job.run import run_tune_job

    runs = tmp_path / "runs"
    settings = TuneSettings(
        task=write_task(tmp_path / "task", 8),
        methods=["cactus"],
        n_drafts=[4],
        trials=2,
        confirm="seeds",
        stage_size=4,
        c_rel=0.2,
        output_dir=str(runs),
        storage=f"sqlite:///{tmp_path / 'o.db'}",
    )
    said = []
    with pytest.raises(SystemExit) as stop:
        with guarded(
            settings, "synthetic-v1", lambda: ["synthetic__cactus__synthetic-pair"], "relaxtune tune ...", said.append
        ):
            run_tune_job(
                settings,
                SyntheticPair(),
                progress=False,
                track=False,
                evaluate_fn=FullDisk(10),
                log=lambda message: None,
            )
    assert stop.value.code == 1 and len(said) == 1
    text = said[0]
    full = f"the disk is full (no space left on device writing {runs / 'x.jsonl'})"
    assert re.match(r"failed after \d+:\d\d: ", text) and full in text, text
    assert f"Kept: 8 samples in 1 record file under {runs / 'synthetic-v1'}; trials finished: cactus 0." in text
    assert "free some space (or give --output-dir on another disk), then run the same command again" in text
    log = Path(text.split("The full traceback is in ")[1].rstrip("."))
    assert log.parent == runs / "logs" and "OSError: [Errno 28] No space left on device" in log.read_text()
    assert "Traceback (most recent call last)" in log.read_text() and "Traceback" not in text
    study = optuna.load_study(study_name="synthetic__cactus__synthetic-pair", storage=settings.storage_url)
    assert [t.state.name for t in study.trials] == ["WAITING", "WAITING"]  # no trial burnt by the disk


def test_the_causes_a_failure_is_named_by():
    import sqlite3

    assert diagnose(OSError(errno.EDQUOT, "Disk quota exceeded"))[0] == "the disk is full (no space left on device)"
    locked = sqlite3.OperationalError("database is locked")
    assert diagnose(locked)[0] == "a database is locked by another process (database is locked)"
    try:
        try:
            raise sqlite3.DatabaseError("file is not a database")
        except sqlite3.DatabaseError as err:
            raise RuntimeError("could not open the storage") from err
    except RuntimeError as wrapped:
        assert diagnose(wrapped)[0] == "a database file is corrupt (file is not a database)"
    assert diagnose(ConnectionRefusedError(111, "Connection refused"))[0].startswith("a server is gone")
    assert diagnose(ValueError("a bug")) is None
