"""The same verdicts whatever contains the solutions and wherever the venv lives (issue 38).

The same solutions (numpy in call-based and stdin programs, a returned numpy array compared,
a package only the venv has, passes, wrong answers, exceptions and timeouts) are graded
under bubblewrap and under the process-group fallback (``RELAXTUNE_SANDBOX``), from this
venv, from a venv reached through a symlink whose numpy (and ``TMPDIR``) lies under a home
directory others cannot enter, and, as root, as an unprivileged user from its own closed
home; every verdict and detail must be the expected one. A bubblewrap that cannot start
says why once and the fallback grades; a sandbox that fails later says so once."""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from relaxtune.graders import code as code_grader
from relaxtune.graders.code import grade_code
from relaxtune.graders.sandbox import launcher, packages, sandbox_info

HAVE_BWRAP = shutil.which("bwrap", path="/usr/bin:/bin:/usr/sbin:/sbin") is not None
HAVE_NUMPY = packages._package_dirs() != []
REPO = Path(__file__).resolve().parents[1]
PURELIB = Path(sysconfig.get_paths()["purelib"])
SUM_CALL = {"tests": [{"input": "[1, 2, 3]", "output": "6"}, {"input": "[]", "output": "0"}], "fn_name": "total"}
SUM_STDIN = {"tests": [{"input": "1 2 3\n", "output": "6\n"}]}
HE = {
    "prompt": 'def add(a, b):\n    """Sum."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
}
FAST = {"timeout": 0.5}  # CPU seconds per test: a cheap timeout
NO_NUMPY = "test 0: ModuleNotFoundError: No module named 'numpy'"


def _fence(code: str) -> str:
    return f"```python\n{code}```"


# (name, response, gold, grade_code keywords, verdict and detail with numpy available)
CASES = [
    (
        "numpy call-based",
        _fence("import numpy as np\ndef total(xs):\n    return int(np.sum(np.array(xs, dtype=np.int64)))\n"),
        SUM_CALL,
        {},
        "pass",
        "2 tests passed",
    ),
    (
        "numpy scalar returned",
        _fence("import numpy as np\ndef total(xs):\n    return np.int64(sum(xs))\n"),
        SUM_CALL,
        {},
        "pass",
        "2 tests passed",
    ),
    (
        "numpy array returned, equal",
        _fence("import numpy as np\ndef total(xs):\n    return np.array([sum(xs)])\n"),
        SUM_CALL,
        {},
        "pass",
        "2 tests passed",
    ),
    (
        "numpy array returned, compared",
        _fence("import numpy as np\ndef total(xs):\n    return np.array([sum(xs), 1])\n"),
        SUM_CALL,
        {},
        "wrong_answer",
        "test 0: expected 6, got array([6, 1])",
    ),
    (
        "numpy raises",
        _fence("import numpy as np\ndef total(xs):\n    return int(np.array(xs).reshape(2, 2).sum())\n"),
        SUM_CALL,
        {},
        "runtime_error",
        "test 0: ValueError: cannot reshape array of size 3 into shape (2,2)",
    ),
    (
        "numpy stdin",
        _fence("import numpy as np\nprint(int(np.array(input().split(), dtype=int).sum()))\n"),
        SUM_STDIN,
        {},
        "pass",
        "1 tests passed",
    ),
    (
        "numpy stdin wrong",
        _fence("import numpy as np\nprint(np.array(input().split(), dtype=int).sum() + 1)\n"),
        SUM_STDIN,
        {},
        "wrong_answer",
        "test 0: line 1: expected '6', got '7'",
    ),
    (
        "numpy wrong",
        _fence("import numpy as np\ndef total(xs):\n    return int(np.prod(np.array(xs)))\n"),
        SUM_CALL,
        {},
        "wrong_answer",
        "test 1: expected 0, got 1",
    ),
    (
        "venv-only package",
        _fence("import math_verify\ndef total(xs):\n    return sum(xs)\n"),
        SUM_CALL,
        {},
        "runtime_error",
        "test 0: ModuleNotFoundError: No module named 'math_verify'",
    ),
    ("plain pass", _fence("def total(xs):\n    return sum(xs)\n"), SUM_CALL, {}, "pass", "2 tests passed"),
    (
        "call raises",
        _fence("def total(xs):\n    raise ValueError('no total')\n"),
        SUM_CALL,
        {},
        "runtime_error",
        "test 0: ValueError: no total",
    ),
    (
        "call timeout",
        _fence("def total(xs):\n    while True:\n        pass\n"),
        SUM_CALL,
        FAST,
        "time_limit",
        "test 0: over 0.5 CPU seconds (its whole process tree)",
    ),
    ("stdin wrong", _fence("print(7)\n"), SUM_STDIN, {}, "wrong_answer", "test 0: line 1: expected '6', got '7'"),
    (
        "stdin timeout",
        _fence("while True:\n    pass\n"),
        SUM_STDIN,
        FAST,
        "time_limit",
        "test 0: over 0.5 CPU seconds (its whole process tree)",
    ),
    ("humaneval pass", _fence("def add(a, b):\n    return a + b\n"), HE, {}, "pass", "1 tests passed"),
    (
        "humaneval wrong",
        _fence("def add(a, b):\n    return a - b\n"),
        HE,
        {},
        "wrong_answer",
        "test 0: assert candidate(2, 3) == 5",
    ),
]


def _expected() -> list[tuple[str, str]]:
    """(verdict, detail) of each case here: numpy's cases fail to import it where it is not installed."""
    return [
        (verdict, detail) if HAVE_NUMPY or "numpy" not in name else ("runtime_error", NO_NUMPY)
        for name, _, _, _, verdict, detail in CASES
    ]


SCRIPT = """
import json, os, sys
from relaxtune.graders.code import grade_code
from relaxtune.graders.sandbox import sandbox_info
import tests.test_sandbox_site as t
mode = sys.argv[1]
if mode == "process-group":
    os.environ["RELAXTUNE_SANDBOX"] = mode
info = sandbox_info()
graded = [grade_code(r, g, **kw) for _, r, g, kw, _, _ in t.CASES]
print(json.dumps({mode: {"kind": info.kind, "site": list(info.site), "site_dir": info.site_dir, "note": info.note,
                         "graded": [[v.verdict, v.detail] for v in graded]}}))
"""


def _modes() -> list[str]:
    return ["bubblewrap", "process-group"] if HAVE_BWRAP else ["process-group"]


def _run(python: str, cwd: str, tmpdir: str | None = None, user: str | None = None) -> dict:
    """Every case graded under each containment by ``python`` (as ``user`` when given,
    with ``TMPDIR`` when given), each containment in a process of its own, side by side:
    {mode: what it saw}."""
    env = {k: v for k, v in os.environ.items() if k not in ("RELAXTUNE_SANDBOX", "VIRTUAL_ENV", "TMPDIR")}
    env["PYTHONPATH"] = str(REPO)
    if tmpdir:
        env["TMPDIR"] = tmpdir
    prefix = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items())] if user else []
    runs = {
        mode: subprocess.Popen(
            [*prefix, python, "-c", SCRIPT, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        for mode in _modes()
    }
    result = {}
    for mode, run in runs.items():
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        result.update(json.loads(out.strip().splitlines()[-1]))
    return result


def _check(result: dict) -> None:
    """Each containment is the one asked for and gives every expected verdict and detail
    (the detail before its notes: ``" [sandbox: process group only..."``)."""
    for mode in _modes():
        assert result[mode]["kind"] == mode, result[mode]["note"]
        graded = result[mode]["graded"]
        assert [v for v, _ in graded] == [v for v, _ in _expected()], (mode, graded)
        for (_, detail), (_, want), case in zip(graded, _expected(), CASES):
            assert detail == want or detail.startswith(f"{want} ["), (mode, case[0], detail)
    assert len({json.dumps([v for v, _ in r["graded"]]) for r in result.values()}) == 1


def test_both_containments_give_the_same_verdicts():
    _check(_run(sys.executable, str(REPO)))


def _venv_with_numpy(python: str, venv: Path) -> None:
    """A venv of ``python`` at ``venv`` holding its own copy of numpy, then this venv's
    packages (math-verify, relaxtune's dependencies) after it."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    inner = next((venv / "lib").glob("python3*/site-packages"))
    for name in packages.PACKAGES:
        if (PURELIB / name).is_dir():
            shutil.copytree(PURELIB / name, inner / name, symlinks=True)
    (inner / "outer.pth").write_text(f"{PURELIB}\n")


@pytest.mark.skipif(not HAVE_NUMPY, reason="numpy is not installed in this venv")
def test_a_venv_through_a_symlink_under_a_closed_home(tmp_path):
    """A venv under a home directory only its owner can enter, reached through a symlink,
    with ``TMPDIR`` in that home too: numpy is found by its resolved path, and (as root,
    where each run is a fresh uid that cannot enter the home) copied with the harness's
    files to a temporary directory every user reaches."""
    home = tmp_path / "home"
    home.mkdir()
    venv = home / "venv"
    _venv_with_numpy(sys.executable, venv)
    (home / "tmp").mkdir()
    home.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(venv)
    python = str(link / "bin" / "python")
    check = subprocess.run(
        [python, "-c", "import numpy; print(numpy.__file__)"], capture_output=True, text=True, timeout=120
    )
    assert check.stdout.startswith(str(link)), check  # the interpreter reports the path through the link
    result = _run(python, str(tmp_path), tmpdir=str(home / "tmp"))
    _check(result)
    if os.geteuid() == 0:  # the sandbox's user is another: numpy was copied out of the closed home
        for mode in _modes():
            assert all(not s.startswith(str(home)) for s in result[mode]["site"]), result[mode]
            assert not result[mode]["site_dir"].startswith(str(home)), result[mode]


@pytest.mark.skipif(
    os.geteuid() != 0
    or not HAVE_NUMPY
    or not shutil.which("runuser")
    or packages.version_of("/usr/bin/python3") != tuple(sys.version_info[:2])
    or not packages.readable_by_all(str(PURELIB))
    or not packages.readable_by_all(str(REPO)),
    reason="needs root (to become nobody), runuser, /usr/bin/python3 of this version, and this "
    "venv's packages and the repository readable by nobody",
)
def test_an_unprivileged_user_through_a_symlink_under_its_closed_home():
    """As nobody (bubblewrap in its own user namespace, no fresh uid), from a venv under its
    own home that others cannot enter, reached through a symlink: the same verdicts."""
    top = Path(tempfile.mkdtemp(prefix="relaxtune-nobody-site-"))  # pytest's tmp_path is closed to nobody
    try:
        top.chmod(0o755)
        home = top / "home"
        home.mkdir()
        _venv_with_numpy("/usr/bin/python3", home / "venv")
        nobody = pwd.getpwnam("nobody").pw_uid
        for path in [home, *home.rglob("*")]:
            os.lchown(path, nobody, -1)
        home.chmod(0o700)
        (top / "link").symlink_to(home / "venv")
        result = _run(str(top / "link" / "bin" / "python"), "/", user="nobody")
    finally:
        shutil.rmtree(top, ignore_errors=True)
    if HAVE_BWRAP and result["bubblewrap"]["kind"] == "process-group":
        pytest.skip(f"bubblewrap does not start for nobody here: {result['bubblewrap']['note']}")
    _check(result)


def test_readable_by_all_follows_links_and_modes():
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="relaxtune-readable-"))  # pytest's tmp_path lies under a closed directory
    try:
        top.chmod(0o755)
        closed = top / "closed"
        (closed / "pkg").mkdir(parents=True)
        (closed / "pkg" / "a.py").write_text("x = 1\n")
        closed.chmod(0o700)
        link = top / "link"
        link.symlink_to(closed / "pkg")
        assert not packages.readable_by_all(str(link))
        closed.chmod(0o755)
        assert packages.readable_by_all(str(link), tree=True)
        (closed / "pkg" / "a.py").chmod(0o600)
        assert packages.readable_by_all(str(link)) and not packages.readable_by_all(str(link), tree=True)
        assert not packages.readable_by_all(str(top / "nothing"))
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.skipif(not HAVE_BWRAP, reason="no bubblewrap here")
def test_a_sandbox_that_cannot_start_says_why_once_and_the_fallback_grades(monkeypatch, caplog, tmp_path):
    """bwrap refusing to start (here: a package directory it cannot bind) is found by the
    probe: one warning naming bwrap's own message, and solutions graded, not errors."""
    real_site_dir = packages.site_dir
    missing = str(tmp_path / "gone" / "numpy")

    def broken(python, other_user):
        site = real_site_dir(python, other_user)
        return packages.SiteDir(site.path, (("numpy", missing),), site.copied, site.note)

    monkeypatch.setattr(launcher.packages, "site_dir", broken)
    sandbox_info.cache_clear()
    caplog.set_level(logging.WARNING)
    try:
        info = sandbox_info()
        verdicts = [grade_code(_fence("def total(xs):\n    return sum(xs)\n"), SUM_CALL).verdict for _ in range(3)]
        sandbox_info()
    finally:
        sandbox_info.cache_clear()
    assert info.kind == "process-group"
    assert "bubblewrap cannot start here: bwrap:" in info.note and missing in info.note
    assert verdicts == ["pass"] * 3
    warnings = [r for r in caplog.records if "bubblewrap cannot start" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()


def test_a_package_directory_left_by_a_killed_grader_is_swept():
    import tempfile

    dead = 2**22 + 1  # above the kernel's largest pid_max: no such process
    left = Path(tempfile.gettempdir()) / f"relaxtune-site-{dead}-abc123"
    (left / "numpy").mkdir(parents=True)
    mine = Path(tempfile.mkdtemp(prefix=f"relaxtune-site-{os.getpid()}-"))
    try:
        packages._sweep()
        assert not left.exists() and mine.exists()
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(mine, ignore_errors=True)


def test_a_sandbox_that_fails_after_starting_says_so_once(monkeypatch, caplog):
    """A sandbox that started but sends no verdict (here: the fallback's harness is gone)
    grades each solution grader_error with the reason, and logs it once, in one line."""
    monkeypatch.setenv("RELAXTUNE_SANDBOX", "process-group")
    monkeypatch.setattr(launcher, "HARNESS", Path(tempfile.gettempdir()) / "relaxtune-no-such-harness.py")
    monkeypatch.setattr(code_grader, "_failed", [])
    sandbox_info.cache_clear()
    caplog.set_level(logging.WARNING)
    try:
        graded = [grade_code(_fence("def total(xs):\n    return sum(xs)\n"), SUM_CALL) for _ in range(3)]
    finally:
        sandbox_info.cache_clear()
    assert [v.verdict for v in graded] == ["grader_error"] * 3
    assert all(
        "the sandbox sent no verdict:" in v.detail and "relaxtune-no-such-harness.py" in v.detail for v in graded
    )
    said = [r.getMessage() for r in caplog.records if "sandbox sent no verdict" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and "relaxtune-no-such-harness.py" in said[0], said


def test_files_for_the_sandbox_user_skip_a_closed_temporary_directory(monkeypatch):
    """A ``TMPDIR`` others cannot enter is passed over for ``/tmp``; an open one is kept."""
    top = Path(tempfile.mkdtemp(prefix="relaxtune-tmpdir-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "open").mkdir(mode=0o777)
        (top / "open").chmod(0o1777)
        (top / "closed" / "tmp").mkdir(parents=True)
        (top / "closed" / "tmp").chmod(0o1777)
        (top / "closed").chmod(0o700)
        monkeypatch.setattr(tempfile, "tempdir", str(top / "open"))
        assert packages.shared_tmp() == str(top / "open")
        monkeypatch.setattr(tempfile, "tempdir", str(top / "closed" / "tmp"))
        assert packages.shared_tmp() == "/tmp"
    finally:
        shutil.rmtree(top, ignore_errors=True)
