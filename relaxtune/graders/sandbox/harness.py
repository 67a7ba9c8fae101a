"""The code sandbox's harness: runs every test of one solution, reports one verdict.

Started by ``relaxtune.graders.sandbox.launcher`` as a script (standard library
only, any Python 3.8+), normally under bubblewrap as PID 1 of its own PID
namespace (``bwrap.py``). It reads one job (JSON) on stdin and writes exactly one
frame, ``RELAXTUNE-VERDICT <nonce> <json>``, on stdout once every test has run or
one has failed: the verdict never comes from an exit status.

The harness never runs solution code itself. Each test runs in a forked child
(``child.run_test``: limits, stdin and capped output files, a report file with a
per-test token); the frame's nonce never reaches a child (zeroed after the fork,
and the result pipe replaced). While a test runs, the CPU time of its whole
process tree is summed (``confine.tree_cpu``): spinning children count. After
each test every other process of the namespace is killed (``kill(-1)`` from PID
1), so forked and ``setsid()`` descendants die too. The harness's own files
(inputs, captured output, reports) live on its own tmpfs (``/run/relaxtune``),
apart from the solution's ``/tmp``. Without bubblewrap (the launcher's fallback)
the harness runs in its own process group and says so in the frame's notes.

Threat model: model-written code that ends early, overrides equality, shadows
or patches builtins or modules, escapes as processes, floods output or memory,
reads stdin, writes files, connects to host sockets or sleeps. The solution and
its test share one process (as in the official harnesses), so a program that
deliberately walks the interpreter's memory to find its child's token could
forge that child's report, never the frame's nonce.
"""

import sys

if sys.path and sys.path[0] == __file__.rpartition("/")[0]:
    sys.path.pop(0)  # solutions must not import our modules; imported below by path instead

import errno
import importlib.util
import json
import marshal
import os
import select
import signal
import time


def _load(name: str):
    """A sibling module of this script, by path (our directory is not on sys.path), as
    ``relaxtune_sandbox_<name>`` in ``sys.modules``."""
    path = f"{__file__.rpartition('/')[0]}/{name}.py"
    spec = importlib.util.spec_from_file_location(f"relaxtune_sandbox_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


checks, confine = _load("checks"), _load("confine")
child = _load("child")

FRAME = "RELAXTUNE-VERDICT"


# ------------------------------------------------------------------ the harness (never runs solution code)


def _wait(pid: int, job: dict, namespaced: bool):
    """Wait for test child ``pid``: at most ``job["wall"]`` seconds, and, when ``job["cpu"]``
    is set, at most that many CPU seconds of its whole process tree (then kill it).
    Returns (status, tree cpu seconds, why it was killed: None, "wall" or "cpu")."""
    start, killed = time.monotonic(), None
    base = confine.tree_cpu(namespaced)
    cpu = 0.0
    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    try:
        while True:
            got, status, _ = os.wait4(pid, 0 if killed else os.WNOHANG)
            if got:
                return status, max(cpu, confine.tree_cpu(namespaced) - base), killed
            cpu = confine.tree_cpu(namespaced) - base
            left = start + job["wall"] - time.monotonic()
            if left <= 0 or job.get("cpu") and cpu > job["cpu"]:
                killed = "wall" if left <= 0 else "cpu"
                os.kill(pid, signal.SIGKILL)  # the rest of its tree dies right after (run: kill_leftovers)
            elif pidfd is not None:
                select.select([pidfd], [], [], min(left, 0.05))
            else:
                time.sleep(min(left, 0.005))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _tail(path: str, size: int = 2000) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - size))
        return f.read().decode("utf-8", "replace")


def _judge(job: dict, i: int, files: dict, token: bytes, status: int, cpu: float, killed):
    """The verdict of test ``i`` as (verdict, detail), or None when it passed."""
    where, limit = f"test {i}", job["output_limit"]
    sizes = [os.path.getsize(files[name]) for name in ("stdout", "stderr")]
    err = _tail(files["stderr"])
    if max(sizes) >= limit:
        return "output_limit", f"{where}: output limit of {limit >> 20} MiB reached (printed too much)"
    if killed == "wall":
        return "time_limit", f"{where}: still running after {job['wall']:g} s of wall time"
    over_cpu = job.get("cpu") and (cpu > job["cpu"] or os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU)
    if killed == "cpu" or over_cpu:
        return "time_limit", f"{where}: over {job['cpu']:g} CPU seconds (its whole process tree)"
    try:
        with open(files["report"], "rb") as f:
            message = marshal.loads(f.read())
        ok = isinstance(message, tuple) and len(message) == 4 and message[0] == token
    except (OSError, EOFError, ValueError, TypeError):
        ok = False
    if not ok:
        if "MemoryError" in err:
            return "memory", f"{where}: out of memory ({job['memory'] >> 20} MiB)"
        if os.WIFSIGNALED(status):
            return "runtime_error", f"{where}: killed by {signal.Signals(os.WTERMSIG(status)).name}"
        code = os.WEXITSTATUS(status)
        if code == child.SETUP_FAILED and "sandbox set-up failed" in err:
            return "grader_error", err.strip().splitlines()[-1]
        label = "wrong_answer" if code == 0 else "runtime_error"
        return label, f"{where}: the process ended (exit status {code}) before the harness could check it"
    _, state, info, payload = message
    if state == "raised":
        text = f"{info['type']}: {info.get('message', '')}".strip().rstrip(":")
        if info.get("timeout"):
            return "time_limit", f"{where}: over {job['timeout']:g} s of wall time ({text})"
        if info["type"] == "MemoryError" or info.get("errno") == errno.ENOMEM:
            return "memory", f"{where}: out of memory ({job['memory'] >> 20} MiB): {text}"
        if info["exit"]:
            return "wrong_answer", f"{where}: the program exited ({text}) before the tests finished"
        if info.get("not_plain"):
            return "wrong_answer", f"{where}: {info['message']}"
        if info["assertion"] and job["kind"] == "humaneval":
            return "wrong_answer", f"{where}: {info.get('test_line') or text}"
        return "runtime_error", f"{where}: {text}"
    if job["kind"] == "stdin":
        with open(files["stdout"], "rb") as f:
            got = f.read().decode("utf-8", "replace")
        same, why = checks.same_lines(got, files["expected"])
        return None if same else ("wrong_answer", f"{where}: {why}")
    if job["kind"] == "call" and not (isinstance(payload, tuple) and payload[0] is True):
        shown = payload[1] if isinstance(payload, tuple) and len(payload) == 2 else "?"
        return "wrong_answer", f"{where}: expected {checks.short(files['expected'])}, got {shown}"
    return None


def _prepare(job: dict, notes: list):
    """Directories for the harness's files and the tests' work; returns (private dir, uid for the children)."""
    box = job["sandbox"]
    if box["bwrap"]:
        private, workdir = box["private"], "/tmp"
    else:
        private, workdir = os.path.join(box["base"], ".relaxtune"), os.path.join(box["base"], "work")
        if os.geteuid() == 0:
            confine.no_network(notes)
        os.makedirs(private, mode=0o700, exist_ok=True)
        os.makedirs(workdir, mode=0o700, exist_ok=True)
    if box.get("site"):
        sys.path.insert(0, box["site"])
    if job["kind"] != "humaneval":  # LiveCodeBench's runner imports numpy before its reliability_guard
        try:
            import numpy  # noqa: F401
        except ImportError as err:
            if box.get("site"):
                notes.append(f"numpy did not load: {err}")
    uid = box.get("uid")
    if uid is not None:
        try:
            os.chown(workdir, uid, uid)
        except OSError:  # an id this host does not map: nobody
            uid = 65534
            os.chown(workdir, uid, uid)
    job["workdir"] = workdir
    return private, uid


def run(job: dict, nonce: bytearray, notes: list) -> dict:
    """Every test of the job in turn; the verdict as a dict."""
    if job["kind"] == "humaneval":
        job["tests"] = [{"input": "", "output": None}]
    private, uid = _prepare(job, notes)
    tests = job.pop("tests")
    namespaced = job["sandbox"]["bwrap"]
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    for i, test in enumerate(tests):
        files = {name: os.path.join(private, name) for name in ("stdout", "stderr", "report", "input")}
        with open(files["input"], "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(test["input"])
        files["expected"] = json.loads(test["output"]) if job["kind"] == "call" else test["output"]
        token = bytearray(os.urandom(16))
        pid = os.fork()
        if pid == 0:
            child.run_test(job, files, token, nonce, uid)
        status, cpu, killed = _wait(pid, job, namespaced)
        confine.kill_leftovers(namespaced)
        failure = _judge(job, i, files, token, status, cpu, killed)
        if failure is not None:
            return {"verdict": failure[0], "test": i, "detail": failure[1], "tests": i + 1, "notes": notes}
    return {
        "verdict": "pass",
        "test": None,
        "detail": f"{len(tests)} tests passed",
        "tests": len(tests),
        "notes": notes,
    }


def main() -> None:
    """Read the job on stdin, run it, write the frame on stdout, end (every leftover dies with us)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    confine.not_dumpable()  # no /proc/1/fd or ptrace for the children
    with open(0, "rb", closefd=False) as f:
        job = json.loads(f.read())
    nonce = bytearray(job.pop("nonce").encode())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for name in checks.PRELUDE_MODULES:  # loaded once here: every child starts with them
        __import__(name)
    notes: list = []
    try:
        result = run(job, nonce, notes)
    except Exception as err:
        result = {
            "verdict": "grader_error",
            "test": None,
            "detail": f"harness: {type(err).__name__}: {err}",
            "tests": 0,
            "notes": notes,
        }
    frame = f"{FRAME} {nonce.decode()} {json.dumps(result)}\n".encode()
    while frame:
        frame = frame[os.write(1, frame) :]
    confine.kill_leftovers(job["sandbox"]["bwrap"])
    os._exit(0)


if __name__ == "__main__":
    main()
