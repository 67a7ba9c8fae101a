"""The code sandbox's harness: runs every test of one solution, reports one verdict.

Started by ``relaxtune.graders.sandbox.launcher`` as a script (standard library
only, any Python 3.8+), normally as PID 1 of fresh PID, mount, network and IPC
namespaces. It reads one job (JSON) on stdin and writes exactly one frame,
``RELAXTUNE-VERDICT <nonce> <json>``, on stdout once every test has run or one
has failed: the verdict never comes from an exit status.

The harness never runs solution code itself. Each test runs in a forked child
that takes its stdin from the test input (a file), writes stdout and stderr to
size-capped files, gets CPU, memory, file-size, file and process limits, drops
to an unprivileged user, and reports back through a file with a per-child
token; the frame's nonce never reaches a child (zeroed after the fork, and the
result pipe replaced). After each test every other process of the namespace is
killed (``kill(-1)`` from PID 1), so forked and ``setsid()`` descendants die too.
With namespaces the root filesystem is remounted read-only and ``/tmp``,
``/var/tmp``, ``/dev/shm`` are private tmpfs mounts: a solution leaves nothing
behind. Without namespaces (the launcher's fallback) the harness runs in its
own process group and says so in the frame's notes.

Threat model: model-written code that ends early, overrides equality, shadows
or patches builtins, escapes as processes, floods output or memory, reads
stdin, writes files or sleeps. Within a child, what the harness uses after the
solution started is bound beforehand, so patching ``builtins`` or modules
changes nothing; a program that deliberately walks the interpreter's frames to
find the child's token could still forge that child's report (HumanEval's tests
run in the solution's process by design), never the frame's nonce.
"""

import sys

if sys.path and sys.path[0] == __file__.rpartition("/")[0]:
    sys.path.pop(0)  # solutions must not import our modules; imported below by path instead

import builtins  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import marshal  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402


def _load(name: str):
    """A sibling module of this script, by path (our directory is not on sys.path)."""
    path = f"{__file__.rpartition('/')[0]}/{name}.py"
    spec = importlib.util.spec_from_file_location(f"relaxtune_sandbox_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks, confine = _load("checks"), _load("confine")

FRAME = "RELAXTUNE-VERDICT"
SETUP_FAILED = 121  # a child's exit status when its sandbox could not be set up


class NotPlain(BaseException):
    """A returned value that is not a plain builtin value (never caught by ``except Exception``)."""


# ------------------------------------------------------------------ one test, in a forked child


def _open_std(fd: int, mode: str):
    return open(fd, mode, closefd=False, encoding="utf-8", errors="surrogateescape" if "r" in mode else "strict")


def _module(name: str, builtin_names: dict) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__["__builtins__"] = builtin_names
    sys.modules[name] = module
    return module


def _guarded(candidate, not_plain=checks.not_plain):
    """``candidate`` whose return values must be plain builtin values (checked before the test sees them)."""

    def guarded(*args, **kwargs):
        value = candidate(*args, **kwargs)
        bad = not_plain(value)
        if bad is not None:
            raise NotPlain(f"returned a {bad}; only plain builtin values are compared")
        return value

    return guarded


def _run_solution(job: dict, args: list, _exec=exec, _compile=compile, _isinstance=isinstance, _getattr=getattr,
                  _vars=vars, _dict=dict, not_plain=checks.not_plain, guarded=_guarded, prelude=checks.prelude(),
                  NotPlain=NotPlain):
    """Run the solution for one test; returns the payload to report (call-based: the value).
    Everything used after the solution starts is bound here beforehand (default arguments),
    so patching builtins or modules cannot change what the harness does."""
    kind, names = job["kind"], _dict(_vars(builtins))  # names: the builtins before the solution can patch them
    if kind == "humaneval":  # the official program is prompt + completion; tests run apart from it
        solution = _module("candidate", builtins)  # not __main__: the official harness runs no __main__ block
        scope = solution.__dict__
        _exec(_compile(job["code"], "solution.py", "exec"), scope)
        if job["entry_point"] not in scope:
            raise NameError(f"name {job['entry_point']!r} is not defined")
        candidate = guarded(scope[job["entry_point"]])
        tests = {"__name__": "humaneval_test", "__builtins__": names}
        _exec(_compile(job["prompt"], "prompt.py", "exec"), tests)
        tests[job["entry_point"]] = candidate  # a test may call the entry by name (HumanEval/33)
        _exec(_compile(job["test"], "test.py", "exec"), tests)
        tests["check"](candidate)
        return None
    module = _module("__main__" if kind == "stdin" else "solution", builtins)
    scope = module.__dict__
    _exec(_compile(prelude, "prelude.py", "exec"), scope)
    code = _compile(job["code"], "solution.py", "exec")
    if kind == "stdin":
        try:
            _exec(code, scope)
        except SystemExit:  # the official runner ends the program here and keeps its output
            pass
        return None
    _exec(code, scope)
    target = scope["Solution"]() if _isinstance(scope.get("Solution"), type) else module
    value = _getattr(target, job["fn_name"])(*args)
    bad = not_plain(value)
    if bad is not None:
        raise NotPlain(f"returned a {bad}; only plain builtin values are compared")
    return value


def _child(job: dict, files: dict, token: bytes, nonce: bytearray, uid, _dump=marshal.dumps, _write=os.write,
           _exit=os._exit) -> None:
    """The forked child: set up, drop privileges, run, report ``(token, status, info, payload)``; never returns."""
    for i in range(len(nonce)):
        nonce[i] = 0
    try:
        report = os.open(files["report"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for target, (path, flags) in enumerate(
                [(files["input"], os.O_RDONLY), (files["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                 (files["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)]):
            fd = os.open(path, flags, 0o600)
            os.dup2(fd, target)  # the result pipe (fd 1) is gone from here on
            os.close(fd)
        os.dup2(report, 3)
        os.closerange(4, 1 << 16)
        report = 3
        args = []
        if job["kind"] == "call":  # one JSON value per input line, read before the solution runs
            with open(files["input"], encoding="utf-8") as f:
                args = [json.loads(line) for line in f.read().split("\n")]
        os.chdir(job["workdir"])
        cpu = max(1, -int(-job["timeout"] // 1))
        for which, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (job["memory"],) * 2),
                             (resource.RLIMIT_FSIZE, (job["output_limit"],) * 2), (resource.RLIMIT_NOFILE, (64, 64)),
                             (resource.RLIMIT_NPROC, (32, 32)), (resource.RLIMIT_CORE, (0, 0))):
            resource.setrlimit(which, value)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the output cap a write fails; the harness sees the size
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        elif job["userns"]:
            confine.drop_capabilities()
        confine.no_new_privileges()
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": job["workdir"], "LANG": "C.UTF-8"})
        sys.stdin, sys.stdout, sys.stderr = _open_std(0, "r"), _open_std(1, "w"), _open_std(2, "w")
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        sys.argv = ["solution.py"]
        if hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(0)  # big integers print whole (the official runner raised the limit)
        streams = (sys.stdout, sys.stderr)
    except BaseException as err:  # noqa: BLE001 - the harness reports a grader error
        os.write(2, f"sandbox set-up failed: {type(err).__name__}: {err}\n".encode())
        os._exit(SETUP_FAILED)
    try:
        try:
            message = (token, "ok", None, _run_solution(job, args))
        except BaseException as err:  # noqa: BLE001 - every way a solution can fail is reported
            message = (token, "raised", _describe(err, job), None)
        for stream in streams:
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - a closed or full stream: its size tells the harness
                pass
        try:
            data = _dump(message)
        except ValueError as err:  # a value nested too deep to send back
            data = _dump((token, "raised", {"type": "ValueError", "message": str(err), "exit": False,
                                            "assertion": False}, None))
        while data:
            data = data[_write(report, data):]
    finally:
        _exit(0)


def _describe(err: BaseException, job: dict, _type=type, _isinstance=isinstance, _str=str) -> dict:
    """What a solution raised, for the harness (builtins bound beforehand, as in ``_run_solution``)."""
    info = {"type": _type(err).__name__, "assertion": _isinstance(err, AssertionError),
            "exit": _isinstance(err, SystemExit)}
    try:
        info["message"] = _str(err)[:300]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        info["message"] = "?"
    tb, line = err.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "test.py":
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is not None:
        info["test_line"] = job["test"].splitlines()[line - 1].strip()[:200]
    return info


# ------------------------------------------------------------------ the harness (never runs solution code)


def _wait(pid: int, wall: float):
    """Wait for ``pid`` at most ``wall`` seconds (then kill it). Returns (status, cpu seconds, killed)."""
    deadline, killed = time.monotonic() + wall, False
    pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    try:
        while True:
            got, status, usage = os.wait4(pid, 0 if killed else os.WNOHANG)
            if got:
                return status, usage.ru_utime + usage.ru_stime, killed
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                killed = True
            elif pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.005))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _tail(path: str, size: int = 2000) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - size))
        return f.read().decode("utf-8", "replace")


def _judge(job: dict, i: int, files: dict, token: bytes, status: int, cpu: float, killed: bool):
    """The verdict of test ``i`` as (verdict, detail), or None when it passed."""
    where, limit = f"test {i}", job["output_limit"]
    sizes = [os.path.getsize(files[name]) for name in ("stdout", "stderr")]
    err = _tail(files["stderr"])
    if max(sizes) >= limit:
        return "output_limit", f"{where}: output limit of {limit >> 20} MiB reached (printed too much)"
    if killed:
        return "time_limit", f"{where}: still running after {job['wall']:g} s of wall time"
    if cpu > job["timeout"] or os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        return "time_limit", f"{where}: over {job['timeout']:g} CPU seconds"
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
        if code == SETUP_FAILED and "sandbox set-up failed" in err:
            return "grader_error", err.strip().splitlines()[-1]
        label = "wrong_answer" if code == 0 else "runtime_error"
        return label, f"{where}: the process ended (exit status {code}) before the harness could check it"
    _, state, info, payload = message
    if state == "raised":
        text = f"{info['type']}: {info.get('message', '')}".strip().rstrip(":")
        if info["type"] == "MemoryError":
            return "memory", f"{where}: out of memory ({job['memory'] >> 20} MiB)"
        if info["exit"]:
            return "wrong_answer", f"{where}: the program exited ({text}) before the tests finished"
        if info["type"] == "NotPlain":
            return "wrong_answer", f"{where}: {info['message']}"
        if info["assertion"] and job["kind"] == "humaneval":
            return "wrong_answer", f"{where}: {info.get('test_line') or text}"
        return "runtime_error", f"{where}: {text}"
    if job["kind"] == "stdin":
        with open(files["stdout"], "rb") as f:
            got = f.read().decode("utf-8", "replace")
        same, why = checks.same_lines(got, files["expected"])
        return None if same else ("wrong_answer", f"{where}: {why}")
    if job["kind"] == "call" and not checks.same_value(payload, files["expected"]):
        return "wrong_answer", f"{where}: expected {checks.short(files['expected'])}, got {checks.short(payload)}"
    return None


def _prepare(job: dict, notes: list):
    """Namespaces, directories and the tests' input files; returns (private dir, uid for the children)."""
    box = job["sandbox"]
    if box["namespaces"]:
        confine.private_filesystem(job["tmpfs_mb"], notes)
        base = "/tmp"
    else:
        base = box["base"]
        if os.geteuid() == 0:
            confine.no_network(notes)
    private, workdir = os.path.join(base, ".relaxtune"), os.path.join(base, "work")
    os.makedirs(private, mode=0o700, exist_ok=True)
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    uid = box.get("uid")
    if uid is not None:
        try:
            os.chown(workdir, uid, uid)
        except OSError:  # an id this host does not map: nobody
            uid = 65534
            os.chown(workdir, uid, uid)
    job["workdir"], job["userns"] = workdir, box.get("userns", False)
    for i, test in enumerate(job["tests"]):
        with open(os.path.join(private, f"input{i}"), "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(test["input"])
    return private, uid


def run(job: dict, nonce: bytearray, notes: list) -> dict:
    """Every test of the job in turn; the verdict as a dict."""
    if job["kind"] == "humaneval":
        job["tests"] = [{"input": "", "output": None}]
    private, uid = _prepare(job, notes)
    expected = [t["output"] for t in job.pop("tests")]
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    for i, want in enumerate(expected):
        files = {name: os.path.join(private, name) for name in ("stdout", "stderr", "report")}
        files["input"] = os.path.join(private, f"input{i}")
        token = os.urandom(16)
        pid = os.fork()
        if pid == 0:
            _child(job, files, token, nonce, uid)
        status, cpu, killed = _wait(pid, job["wall"])
        confine.kill_leftovers(job["sandbox"]["namespaces"])
        files["expected"] = json.loads(want) if job["kind"] == "call" else want
        failure = _judge(job, i, files, token, status, cpu, killed)
        if failure is not None:
            return {"verdict": failure[0], "test": i, "detail": failure[1], "tests": i + 1, "notes": notes}
    return {"verdict": "pass", "test": None, "detail": f"{len(expected)} tests passed", "tests": len(expected),
            "notes": notes}


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
    except Exception as err:  # noqa: BLE001 - our own failure: a grader error, never a verdict on the solution
        result = {"verdict": "grader_error", "test": None, "detail": f"harness: {type(err).__name__}: {err}",
                  "tests": 0, "notes": notes}
    frame = f"{FRAME} {nonce.decode()} {json.dumps(result)}\n".encode()
    while frame:
        frame = frame[os.write(1, frame):]
    confine.kill_leftovers(job["sandbox"]["namespaces"])
    os._exit(0)


if __name__ == "__main__":
    main()
