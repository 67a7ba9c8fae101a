"""Code answers, graded by running them in a sandboxed process.

The last fenced python block of the response runs in a fresh process per
solution (per test for stdin/stdout tests), in a throwaway working directory,
with a scrubbed environment (no tokens or keys), resource limits (CPU seconds
per test, address space, file size, open files, processes), its own process
group (killed whole on timeout), and, when started as root, no network (a new
network namespace) and an unprivileged user. The CPU-time limit decides
timeouts, so verdicts do not depend on how many solutions run in parallel;
a wall-clock backstop catches programs that sleep.

Verdicts: "pass", "wrong_answer", "time_limit", "runtime_error", "memory",
"grader_error" (our failure: never a pass).

Test formats (``gold``):
- call-based (HumanEval): ``{"test": "<code defining check>", "entry_point": "f",
  "prompt": "<problem prompt>"}``; the program runs ``check(f)``.
- stdin/stdout (LiveCodeBench): ``{"tests": [{"input": ..., "output": ...}, ...]}``.
- functional (LeetCode-style): ``{"tests": [...], "fn_name": "name"}``; each input
  line is one JSON argument, the output one JSON value.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .base import Verdict

__all__ = ["grade_code", "extract_code", "run_sandboxed", "RunResult"]

DEFAULT_TEST_TIMEOUT = 6.0  # CPU seconds per test
DEFAULT_MEMORY_MB = 1024
DEFAULT_BACKSTOP = 120.0  # wall seconds for all tests of one solution
NOBODY = 65534
CLONE_NEWNET = 0x40000000
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)


def extract_code(response: str) -> str | None:
    """The last fenced block tagged python/py (or, if none is tagged, the last
    untagged block); None when the response has no such block."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    tagged = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    if tagged:
        return tagged[-1]
    untagged = [body for lang, body in blocks if not lang]
    return untagged[-1] if untagged else None


@dataclass(frozen=True)
class RunResult:
    """One sandboxed run: status "ok", "time_limit", "memory", "runtime_error"."""

    status: str
    stdout: str
    stderr: str
    returncode: int | None


def _world_executable(path: str) -> bool:
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    dirs = [os.sep.join(parts[:i]) or os.sep for i in range(1, len(parts))]
    return all(os.stat(d).st_mode & 0o001 for d in dirs) and bool(os.stat(real).st_mode & 0o001)


def sandbox_python() -> tuple[str, bool]:
    """``(interpreter, drop_privileges)``. As root, solutions run as ``nobody``
    (process limits are not enforced for root), so they need an interpreter that
    user can run: this one if it is world-executable, else the system
    ``/usr/bin/python3`` (standard library only); without either, they run as
    root with the other limits only."""
    if os.geteuid() != 0:
        return sys.executable, False
    for candidate in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(candidate) and _world_executable(candidate):
            return candidate, True
    return sys.executable, False


def _sandbox_setup(cpu_seconds: float, memory_mb: int, drop: bool) -> None:  # runs in the child
    os.setsid()
    limits = {
        resource.RLIMIT_CPU: int(cpu_seconds) + 1,
        resource.RLIMIT_AS: memory_mb << 20,
        resource.RLIMIT_FSIZE: 16 << 20,
        resource.RLIMIT_NOFILE: 64,
        resource.RLIMIT_NPROC: 32,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    if os.geteuid() == 0:
        ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET)  # best effort: no network
    if drop:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)  # NPROC is only enforced for unprivileged users


def run_sandboxed(
    program: str, stdin: str = "", *, timeout: float = DEFAULT_TEST_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB
) -> RunResult:
    """Run ``program`` (python source) once in the sandbox.

    Args:
        program: source code.
        stdin: text fed on standard input.
        timeout: CPU seconds allowed (the wall backstop is ``3 * timeout + 2``).
        memory_mb: address-space limit (MiB).

    Returns:
        ``RunResult``.
    """
    workdir = tempfile.mkdtemp(prefix="relaxtune-run-")
    try:
        os.chmod(workdir, 0o777)
        path = os.path.join(workdir, "main.py")
        with open(path, "w") as f:
            f.write(program)
        os.chmod(path, 0o644)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        python, drop = sandbox_python()
        proc = subprocess.Popen(
            [python, "-I", path], cwd=workdir, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, preexec_fn=lambda: _sandbox_setup(timeout, memory_mb, drop), text=True,
        )
        try:
            out, err = proc.communicate(stdin, timeout=3 * timeout + 2)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return RunResult("time_limit", out, err, None)
        _kill_group(proc)  # leftovers (forked children) die with the group
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rc = proc.returncode
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):
        return RunResult("time_limit", out, err, rc)
    if "MemoryError" in err or rc == -signal.SIGSEGV and "memory" in err.lower():
        return RunResult("memory", out, err, rc)
    return RunResult("ok" if rc == 0 else "runtime_error", out, err, rc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _from_run(run: RunResult, test: str) -> Verdict | None:
    """A failure verdict for a run that did not finish cleanly, else None."""
    if run.status == "ok":
        return None
    if run.status == "runtime_error" and "AssertionError" in run.stderr:
        return Verdict(False, "wrong_answer", None, f"{test}: {_last_line(run.stderr)}")
    return Verdict(False, run.status, None, f"{test}: {_last_line(run.stderr)}")


def _same_output(got: str, want: str) -> bool:
    norm = lambda s: [line.rstrip() for line in s.strip().splitlines()]  # noqa: E731
    return norm(got) == norm(want)


_FUNCTIONAL = """
import json as _json, sys as _sys
{code}
_args = [_json.loads(_l) for _l in _sys.stdin.read().splitlines() if _l.strip()]
_f = getattr(Solution(), {fn!r}) if "Solution" in globals() else globals()[{fn!r}]
print(_json.dumps(_f(*_args)))
"""


def grade_code(
    response: str, gold: dict, *, timeout: float = DEFAULT_TEST_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB,
    backstop: float = DEFAULT_BACKSTOP,
) -> Verdict:
    """Grade a code response against call-based or stdin/stdout tests (see module doc).

    Returns:
        ``Verdict`` with ``correct`` only for "pass".
    """
    code = extract_code(response)
    if code is None:
        return Verdict(False, "no_answer", None, "no fenced python block")
    try:
        if "test" in gold:  # call-based, one run
            entry = gold["entry_point"]
            header = "\n".join(line for line in gold.get("prompt", "").splitlines() if line.startswith(("import ", "from ")))
            if f"def {entry}" not in code:
                code = gold.get("prompt", "") + code
            program = f"{header}\n{code}\n\n{gold['test']}\n\ncheck({entry})\n"
            failure = _from_run(run_sandboxed(program, timeout=timeout, memory_mb=memory_mb), "check")
            return failure or Verdict(True, "pass", code[:2000])
        tests = gold["tests"]
        fn = gold.get("fn_name")
        program = _FUNCTIONAL.format(code=code, fn=fn) if fn else code
        start = time.monotonic()
        for i, test in enumerate(tests):
            if time.monotonic() - start > backstop:
                return Verdict(False, "time_limit", code[:2000], f"backstop of {backstop} s over {i} tests")
            run = run_sandboxed(program, test["input"], timeout=timeout, memory_mb=memory_mb)
            failure = _from_run(run, f"test {i}")
            if failure:
                return Verdict(False, failure.verdict, code[:2000], failure.detail)
            want = test["output"]
            same = json.loads(run.stdout) == json.loads(want) if fn else _same_output(run.stdout, want)
            if not same:
                return Verdict(False, "wrong_answer", code[:2000], f"test {i}: expected {want[:100]!r}, got {run.stdout[:100]!r}")
        return Verdict(True, "pass", code[:2000])
    except (OSError, KeyError, ValueError, TypeError) as err:
        return Verdict(False, "grader_error", code[:2000], f"{type(err).__name__}: {err}")
