"""The same verdicts whatever contains the solutions and wherever the venv lives (issue 38).

The same solutions (numpy in call-based and stdin programs, a package only the venv has,
plain passes and failures) are graded under bubblewrap and under the process-group
fallback, from this venv and from a venv reached through a symlink whose numpy lies under
a home directory others cannot enter; every verdict must agree with the expected one. A
bubblewrap that cannot start says why once and the fallback grades."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from relaxtune.graders.code import grade_code
from relaxtune.graders.sandbox import launcher, packages, sandbox_info

HAVE_BWRAP = shutil.which("bwrap", path="/usr/bin:/bin:/usr/sbin:/sbin") is not None
HAVE_NUMPY = packages._package_dirs() != []
SUM_CALL = {"tests": [{"input": "[1, 2, 3]", "output": "6"}, {"input": "[]", "output": "0"}], "fn_name": "total"}
SUM_STDIN = {"tests": [{"input": "1 2 3\n", "output": "6\n"}]}
HE = {
    "prompt": 'def add(a, b):\n    """Sum."""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
}


def _fence(code: str) -> str:
    return f"```python\n{code}```"


# (name, response, gold, verdict with numpy available)
CASES = [
    (
        "numpy call-based",
        _fence("import numpy as np\ndef total(xs):\n    return int(np.sum(np.array(xs, dtype=np.int64)))\n"),
        SUM_CALL,
        "pass",
    ),
    (
        "numpy scalar returned",
        _fence("import numpy as np\ndef total(xs):\n    return np.int64(sum(xs))\n"),
        SUM_CALL,
        "pass",
    ),
    (
        "numpy array returned",
        _fence("import numpy as np\ndef total(xs):\n    return np.array([sum(xs), 1])\n"),
        SUM_CALL,
        "wrong_answer",
    ),
    (
        "numpy stdin",
        _fence("import numpy as np\nprint(int(np.array(input().split(), dtype=int).sum()))\n"),
        SUM_STDIN,
        "pass",
    ),
    (
        "numpy wrong",
        _fence("import numpy as np\ndef total(xs):\n    return int(np.prod(np.array(xs)))\n"),
        SUM_CALL,
        "wrong_answer",
    ),
    (
        "venv-only package",
        _fence("import math_verify\ndef total(xs):\n    return sum(xs)\n"),
        SUM_CALL,
        "runtime_error",
    ),
    ("plain pass", _fence("def total(xs):\n    return sum(xs)\n"), SUM_CALL, "pass"),
    ("humaneval pass", _fence("def add(a, b):\n    return a + b\n"), HE, "pass"),
    ("humaneval wrong", _fence("def add(a, b):\n    return a - b\n"), HE, "wrong_answer"),
]


def _expected() -> list[str]:
    return [verdict if HAVE_NUMPY or "numpy" not in name else "runtime_error" for name, _, _, verdict in CASES]


SCRIPT = """
import json, os, sys
from relaxtune.graders.code import grade_code
from relaxtune.graders.sandbox import sandbox_info
import tests.test_sandbox_site as t
out = {}
for mode in sys.argv[1:]:
    os.environ.pop("RELAXTUNE_SANDBOX", None)
    if mode == "process-group":
        os.environ["RELAXTUNE_SANDBOX"] = mode
    sandbox_info.cache_clear()
    info = sandbox_info()
    out[mode] = {"kind": info.kind, "site": list(info.site), "note": info.note,
                 "verdicts": [grade_code(r, g).verdict for _, r, g, _ in t.CASES]}
print(json.dumps(out))
"""


def _modes() -> list[str]:
    return ["bubblewrap", "process-group"] if HAVE_BWRAP else ["process-group"]


def _run(python: str, cwd: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RELAXTUNE_SANDBOX", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    run = subprocess.run(
        [python, "-c", SCRIPT, *_modes()], capture_output=True, text=True, timeout=600, env=env, cwd=cwd
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _check(result: dict) -> None:
    for mode in _modes():
        assert result[mode]["kind"] == mode, result[mode]["note"]
        assert result[mode]["verdicts"] == _expected(), (mode, result[mode])
    assert len({json.dumps(r["verdicts"]) for r in result.values()}) == 1


def test_both_containments_give_the_same_verdicts():
    _check(_run(sys.executable, str(Path(__file__).resolve().parents[1])))


@pytest.mark.skipif(not HAVE_NUMPY, reason="numpy is not installed in this venv")
def test_a_venv_through_a_symlink_under_a_closed_home(tmp_path):
    """A venv under a home directory only its owner can enter, reached through a symlink:
    numpy is found by its resolved path, copied where the sandbox's user cannot read it."""
    home = tmp_path / "home"
    home.mkdir()
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(sysconfig.get_paths()["purelib"])
    inner = next((venv / "lib").glob("python3*/site-packages"))
    for name in packages.PACKAGES:
        if (purelib / name).is_dir():
            shutil.copytree(purelib / name, inner / name, symlinks=True)
    (inner / "outer.pth").write_text(f"{purelib}\n")  # the rest (math-verify...) after the venv's own numpy
    home.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(venv)
    python = str(link / "bin" / "python")
    check = subprocess.run(
        [python, "-c", "import numpy; print(numpy.__file__)"], capture_output=True, text=True, timeout=120
    )
    assert check.stdout.startswith(str(link)), check  # the interpreter reports the path through the link
    result = _run(python, str(tmp_path))
    _check(result)
    if os.geteuid() == 0:  # the sandbox's user is another: numpy was copied out of the closed home
        for mode in _modes():
            assert all(not s.startswith(str(home)) for s in result[mode]["site"]), result[mode]


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
