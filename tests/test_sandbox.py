"""The code sandbox itself: bounded reading, the backstop, the grader's own memory, the
fallback without namespaces, user namespaces for non-root users, the stdout comparison."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest

from relaxtune.graders.code import grade_code
from relaxtune.graders.sandbox import launcher, read_capped, sandbox_info
from relaxtune.graders.sandbox.checks import same_lines, same_value, trusted_dirs, untrusted

HE = {
    "prompt": 'def add(a, b):\n    """a + b"""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
}
GOOD, BAD = "```python\n    return a + b\n```", "```python\n    return a - b\n```"


def _fence(code: str) -> str:
    return f"```python\n{code}```"


def _processes_with(marker: str) -> list[str]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                found.append(entry)
        except OSError:
            pass
    return found


def test_read_capped_stops_a_flood_and_keeps_little():
    proc = subprocess.Popen(["yes", "flood"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err, ended = read_capped(proc, b"", time.monotonic() + 30, result_cap=1 << 20)
    finally:
        proc.kill()
        proc.wait()
    assert ended == "overflow" and len(out) == 1 << 20 and err == b""


def test_read_capped_keeps_only_the_stderr_tail_and_stops_at_the_deadline():
    script = "import sys, time\nsys.stderr.write('e' * 100000 + 'END')\nsys.stderr.flush()\ntime.sleep(60)\n"
    proc = subprocess.Popen(
        ["python3", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    start = time.monotonic()
    try:
        out, err, ended = read_capped(proc, b"x" * 300000, start + 2, stderr_keep=1000)
    finally:
        proc.kill()
        proc.wait()
    assert ended == "backstop" and time.monotonic() - start < 10
    assert err.endswith(b"END") and len(err) == 1000 and out == b""


def test_backstop_ends_every_run_in_time():
    token = str(secrets.randbelow(10**9) + 10**9)
    code = (
        f"import posix, time\nif posix.fork() == 0:\n    posix.setsid()\n"
        f"    posix.execv('/bin/sleep', ['sleep', '90.{token}'])\ntime.sleep(90)\n"
    )
    start = time.monotonic()
    verdict = grade_code(_fence(code), HE, timeout=30, backstop=2)
    assert verdict.verdict == "time_limit" and "backstop" in verdict.detail
    assert time.monotonic() - start < 15
    if sandbox_info().kind != "process-group":
        assert _processes_with(token) == []


def test_the_graders_own_memory_stays_small_whatever_the_solution_prints():
    floods = [
        "while True:\n    print('x' * 4096)\n",
        "import os\nwhile True:\n    os.write(2, b'e' * 65536)\n",
        "print('y' * (200 << 20))\n",
    ]
    tracemalloc.start()
    try:
        for code in floods:
            tracemalloc.reset_peak()
            verdict = grade_code(_fence(code), HE, timeout=2, memory_mb=1024)
            peak = tracemalloc.get_traced_memory()[1]
            assert verdict.verdict in ("output_limit", "memory"), verdict
            assert peak < 4 << 20, f"{peak} bytes traced while grading {code!r}"
    finally:
        tracemalloc.stop()


def test_bad_gold_is_a_clear_grader_error():
    assert "needs 'test'" in grade_code(GOOD, {"cases": []}).detail
    assert grade_code(GOOD, {"tests": []}).verdict == "grader_error"
    assert "identifier" in grade_code(GOOD, {"tests": [{"input": "", "output": ""}], "fn_name": 3}).detail
    assert "lacks" in grade_code(GOOD, {"test": "def check(c): pass"}).detail


def test_unknown_sandbox_override_is_refused(monkeypatch):
    monkeypatch.setenv("RELAXTUNE_SANDBOX", "none")
    sandbox_info.cache_clear()
    try:
        with pytest.raises(ValueError, match="process-group"):
            sandbox_info()
    finally:
        monkeypatch.delenv("RELAXTUNE_SANDBOX")
        sandbox_info.cache_clear()


def test_fallback_without_namespaces_still_grades_and_says_so(monkeypatch, caplog):
    monkeypatch.setenv("RELAXTUNE_SANDBOX", "process-group")
    sandbox_info.cache_clear()
    try:
        assert sandbox_info().kind == "process-group"
        good, bad = grade_code(GOOD, HE), grade_code(BAD, HE)
        early = grade_code(_fence("def add(a, b):\n    return 0\nimport os\nos._exit(0)\n"), HE)
        loop = grade_code(_fence("while True:\n    pass\n"), HE, timeout=1)
        lcb = grade_code(
            _fence("print(sum(map(int, input().split())))\n"), {"tests": [{"input": "1 2", "output": "3"}]}
        )
    finally:
        monkeypatch.delenv("RELAXTUNE_SANDBOX")
        sandbox_info.cache_clear()
    assert [v.verdict for v in (good, bad, early, loop, lcb)] == [
        "pass",
        "wrong_answer",
        "wrong_answer",
        "time_limit",
        "pass",
    ]
    assert all("process group only" in v.detail for v in (good, bad, early, loop, lcb))
    assert "process group only" in caplog.text


NOBODY_SCRIPT = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1] + "/__init__.py",
                                              submodule_search_locations=[sys.argv[1]])
sandbox = importlib.util.module_from_spec(spec)
sys.modules["sandbox"] = sandbox
spec.loader.exec_module(sandbox)
job = json.loads(sys.stdin.read())
results = []
for code in job.pop("codes"):
    outcome = sandbox.run_job({**job, "code": code}, backstop=30)
    results.append([outcome.frame and outcome.frame["verdict"], outcome.frame and outcome.frame["detail"]])
print(json.dumps({"kind": sandbox.sandbox_info().kind, "results": results}))
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runuser") or not os.path.exists("/usr/bin/python3"),
    reason="needs root (to become nobody), runuser and /usr/bin/python3",
)
@pytest.mark.parametrize("mode", ["bubblewrap", "process-group"])
def test_a_non_root_user(mode):
    """As nobody, the launcher runs bubblewrap in a user namespace (the same containment
    without root), or, told to, a process group (which still grades right)."""
    import json
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="relaxtune-nobody-"))  # readable by nobody, unlike pytest's tmp_path
    os.chmod(home, 0o755)
    package = home / "sandbox"
    shutil.copytree(Path(launcher.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    token = str(secrets.randbelow(10**9) + 10**9)
    escape = f"/tmp/relaxtune-nobody-{token}"
    codes = [HE["prompt"] + "    return a + b\n", HE["prompt"] + "    return a - b\n"]
    if mode == "bubblewrap":
        codes += [
            HE["prompt"] + f"    return a + b\nopen('{escape}', 'w').write('x')\nimport os\n"
            f"import posix\nif posix.fork() == 0:\n    posix.setsid()\n"
            f"    posix.execv('/bin/sleep', ['sleep', '70.{token}'])\n",
            HE["prompt"] + "    return a + b\n"
            "assert 'CapEff:\\t0000000000000000' in open('/proc/self/status').read()\n",
        ]
    job = {
        "kind": "humaneval",
        "prompt": HE["prompt"],
        "test": HE["test"],
        "entry_point": "add",
        "tests": [],
        "timeout": 3.0,
        "cpu": None,
        "wall": 8.0,
        "memory": 1 << 30,
        "output_limit": 1 << 20,
        "tmpfs_mb": 16,
        "private_mb": 16,
        "codes": codes,
    }
    env = ["env", "RELAXTUNE_SANDBOX=process-group"] if mode == "process-group" else []
    try:
        run = subprocess.run(
            ["runuser", "-u", "nobody", "--", *env, "/usr/bin/python3", "-c", NOBODY_SCRIPT, str(package)],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if mode == "bubblewrap" and '"kind": "process-group"' in run.stdout:
        pytest.skip("this kernel refuses user namespaces to unprivileged users")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["kind"] == mode
    assert [r[0] for r in result["results"]] == ["pass", "wrong_answer", "pass", "pass"][: len(codes)], result
    assert not Path(escape).exists() and _processes_with(token) == []


@pytest.mark.parametrize(
    "got, want, same",
    [
        ("3\n", "3", True),
        ("  3  \n\n", "3\n", True),
        ("1 2\n", "1  2", True),
        ("2.50", "2.5", True),
        ("1e3", "1000", True),
        ("0.333333", "0.333333333333", False),
        ("-0", "0", True),
        ("YES", "Yes", False),
        ("1\n2", "1 2", False),
        ("3\n\n4", "3\n4", False),
        ("nan", "nan", True),
        ("NaN", "nan", False),
        ("1,000", "1000", False),
        ("", "", True),
        ("\n", "", True),
        ("3\r\n", "3\n", True),
    ],
)
def test_stdout_comparison_follows_livecodebench(got, want, same):
    assert same_lines(got, want)[0] is same


def test_trusted_values_and_call_comparison():
    """Values compare as the official harnesses compare them unless a type in them has a
    special method of the solution's own (checks.untrusted)."""
    import collections
    import fractions

    dirs = trusted_dirs()
    point = collections.namedtuple("Point", "x y")
    plain = [
        1,
        2.5,
        "a",
        None,
        True,
        (1,),
        {"k": {1, 2}},
        frozenset(),
        collections.Counter("aab"),
        collections.defaultdict(list, {1: [2]}),
        collections.OrderedDict(a=1),
        collections.deque([1]),
        fractions.Fraction(1, 3),
        point(1, 2),
        (x for x in []),
    ]
    assert [untrusted(v, dirs) for v in plain] == [None] * len(plain)
    namespace: dict = {}
    exec(
        compile(
            "class Any:\n    def __eq__(self, other):\n        return True\n"
            "class I(int):\n    def __sub__(self, other):\n        return 0\n"
            "class L(list):\n    __eq__ = list.__ne__\n",
            "solution.py",
            "exec",
        ),
        namespace,
    )
    assert untrusted([[1], [namespace["Any"]()]], dirs) == "Any.__eq__"
    assert untrusted({"k": namespace["I"](3)}, dirs) == "I.__sub__"
    assert untrusted(namespace["L"](), dirs) == "L.__eq__"  # a native method under another name
    cyclic: list = []
    cyclic.append(cyclic)
    assert untrusted(cyclic, dirs) is None  # visited once, no endless walk
    assert same_value((1, 2), [1, 2]) and not same_value([(1, 2)], [[1, 2]]) and not same_value(0.1 + 0.2, 0.3)
    assert same_value(collections.Counter({"a": 2}), {"a": 2}) and same_value(point(1, 2), [1, 2])


@pytest.mark.parametrize("forced", [False, True])
def test_tasks_validate_says_what_contains_code(monkeypatch, forced):
    """`relaxtune tasks validate` names the sandbox a code task's solutions run in, and says
    when it is only a process group."""
    from typer.testing import CliRunner

    from relaxtune.cli import app

    if forced:
        monkeypatch.setenv("RELAXTUNE_SANDBOX", "process-group")
    sandbox_info.cache_clear()
    try:
        out = CliRunner().invoke(app, ["tasks", "validate", "relaxtune/evals/humaneval.yaml"], env={"COLUMNS": "300"})
        kind = sandbox_info().kind
    finally:
        sandbox_info.cache_clear()
    assert out.exit_code == 0, out.output
    if forced or kind == "process-group":
        assert "process group only" in out.output and "host sockets can be reached" in out.output
    else:
        assert "sandbox: bubblewrap" in out.output and "every namespace" in out.output


def test_a_run_group_holds_its_limits_and_leaves_nothing():
    """cgroup.create writes the memory (swap included) and process limits, reports usage and
    memory kills, and remove() kills what is left and deletes the group."""
    from relaxtune.graders.sandbox import cgroup

    if not cgroup.available():
        pytest.skip("this host lets us make no memory and pids control group")
    group = cgroup.create(256 << 20, 16)
    assert group is not None
    try:
        memory = group.dirs[0] / ("memory.max" if group.version == 2 else "memory.limit_in_bytes")
        pids = group.dirs[-1] / "pids.max"
        assert int(memory.read_text()) == 256 << 20 and pids.read_text().strip() == "16"
        script = "x = bytearray(400 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n"
        run = subprocess.run([*group.join_script(), "python3", "-c", script], capture_output=True, timeout=120)
        assert run.returncode == -9  # killed by the memory controller, not by its own limits
        assert group.usage()["oom_kills"] >= 1
        assert group.pids() == []
    finally:
        group.remove()
    assert not any(d.exists() for d in group.dirs)
