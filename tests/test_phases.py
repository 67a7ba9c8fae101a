"""The job's phase timer (relaxtune.tune.phases): exclusive times, phases on other threads, counts."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from relaxtune.tune import phases


class Clock:
    """A clock the test moves: wall and CPU seconds."""

    def __init__(self):
        self.wall = 0.0
        self.cpu = 0.0

    def tick(self, wall, cpu):
        self.wall += wall
        self.cpu += cpu


def timer(clock):
    return phases.PhaseTimer(lambda: clock.wall, lambda: clock.cpu)


def test_nested_phases_are_exclusive_and_add_up():
    c = Clock()
    t = timer(c)
    with t.phase("trials"):
        c.tick(2, 3)
        with t.phase("strict"):
            c.tick(5, 9)
        c.tick(1, 1)
        with t.phase("strict"):
            c.tick(0.5, 0.5)
    d = {p["name"]: p for p in t.to_dict()["phases"]}
    assert d["trials"] == {"name": "trials", "wall": 3.0, "cpu": 4.0, "calls": 1, "overlapped": False}
    assert d["strict"] == {"name": "strict", "wall": 5.5, "cpu": 9.5, "calls": 2, "overlapped": False}
    assert [p["name"] for p in t.to_dict()["phases"]] == ["strict", "trials"]  # in the order they ended
    assert t.to_dict()["wall"] == 8.5


def test_a_phase_on_another_thread_is_overlapped_and_does_not_shorten_the_job_thread():
    c = Clock()
    t = timer(c)
    with t.phase("trials"):
        c.tick(4, 4)

        def background():
            with t.phase("MLflow (tracker thread)"):
                c.tick(1, 1)

        th = threading.Thread(target=background)
        th.start()
        th.join()
    d = {p["name"]: p for p in t.to_dict()["phases"]}
    assert d["MLflow (tracker thread)"]["overlapped"] is True
    assert d["MLflow (tracker thread)"]["wall"] == 1.0
    assert d["trials"]["wall"] == 5.0  # the other thread's phase is not taken off this one
    lines = t.lines()
    assert lines[1].split() == ["MLflow", "(tracker", "thread)", "1.0", "beside", "1.0", "1"]
    assert lines[-1].split()[:3] == ["total", "(job", "thread)"] and lines[-1].split()[-1] == "5.0"


def test_counts_and_save(tmp_path):
    c = Clock()
    t = timer(c)
    t.count("tokens decoded", 120)
    t.count("tokens decoded", 30)
    t.count("verify forward s", 0.25)
    t.add("imports", 3.0, 2.5)
    saved = json.loads(t.save(tmp_path / "x" / "job.phases.json").read_text())
    assert saved["counts"] == {"tokens decoded": 150, "verify forward s": 0.25}
    assert saved["phases"] == [{"name": "imports", "wall": 3.0, "cpu": 2.5, "calls": 1, "overlapped": False}]
    assert t.lines()[-1] == "work: tokens decoded 150, verify forward s 0.25"


def test_module_functions_are_no_ops_without_an_active_timer_and_the_outer_timer_stays():
    assert phases.active() is None
    with phases.phase("x"):
        phases.count("y")  # nothing to record into: no error
    c = Clock()
    outer = timer(c)
    with phases.activate(outer) as t:
        assert t is outer
        with phases.activate() as inner:
            assert inner is outer  # a job inside another records into the outer's timer
            with phases.phase("model load"):
                c.tick(2, 1)
            phases.count("figures drawn")
        assert phases.active() is outer
    assert phases.active() is None
    assert outer.to_dict()["phases"][0]["wall"] == 2.0 and outer.counts == {"figures drawn": 1}


def test_process_age_is_positive_on_linux():
    age = phases.process_age()
    assert age is not None
    wall, cpu = age
    assert wall > 0 and cpu > 0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to know the process's own start")
def test_the_imports_phase_starts_at_relaxtunes_import_not_at_a_shells_start():
    """``sh -c 'sleep 3 && exec python ...'`` runs Python in the shell's process, whose start
    time then holds the sleep (an install, in a fresh-venv trial: "imports 235 s"); the
    imports phase counts from relaxtune's first import."""
    code = (
        "import os, relaxtune.tune.phases as p\n"
        "stat = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\n"
        "uptime = float(open('/proc/uptime').read().split()[0])\n"
        "print(uptime - int(stat[19]) / os.sysconf('SC_CLK_TCK'), p.process_age()[0])"
    )
    run = subprocess.run(
        ["sh", "-c", f'sleep 3 && exec "{sys.executable}" -c "{code}"'], capture_output=True, text=True, check=True
    )
    process, imports = map(float, run.stdout.split())
    assert process - imports >= 2.5 and imports < process  # the sleep is not counted


def test_the_job_revises_its_estimate_once_after_strict_at_the_middle_n():
    from relaxtune.decoding.speed import CostProfile
    from relaxtune.job.run import _reviser
    from relaxtune.tune.estimate import estimate_job
    from relaxtune.tune.settings import TuneSettings

    settings = TuneSettings(task="humaneval", methods=["cactus", "mentored"], limit=8, n_drafts=[4], trials=2)
    profile = CostProfile(t_ar=0.04, t_draft=0.02, t_verify={5: 0.15})
    spec = type("Spec", (), {"repeats": 1, "max_new_tokens": 384})()
    est = estimate_job(
        settings.search, settings.stats, spec, 4, 4, profile, length=(130.0, "given"), device="llamacpp", load=(0.5, 2)
    )
    c = Clock()
    t = timer(c)
    t.add("imports", 5.0, 4.0)
    said = []
    revise = _reviser(settings, t, est, said.append)
    c.tick(30, 30)
    revise(2, None, 10.0)  # another N: nothing
    revise(4, None, 40.0)
    revise(4, None, 99.0)  # said once
    assert len(said) == 1 and said[0].startswith("estimate after strict: about ")
    assert est.revised_seconds == est.revised(35.0, 4, 40.0)[0]
    assert _reviser(settings, None, est, said.append) is None  # no timer: nothing to revise
