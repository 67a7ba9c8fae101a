"""One test of one solution, in the sandbox harness's forked child (``run_test``).

Loaded by path by ``harness.py`` after ``checks`` and ``confine`` (standard library
only, any Python 3.8+). The child takes its stdin from the test input (call-based
tests: ``/dev/null``, as in the official runner's worker process; HumanEval: a
descriptor that refuses reads, as the official harness's stdin raises), writes
stdout and stderr to size-capped files, gets CPU, memory, file-size, file and
process limits, drops to an unprivileged user, runs the solution, and reports
``(token, state, info, payload)`` on its report file.

HumanEval runs in two processes. The test process is forked before any solution
code runs and never runs any: it executes the prompt and the test in a pristine
interpreter and calls the candidate across a pipe, sending the arguments to the
solution process, which answers with a plain value (``marshal``) or what the call
raised. Nothing a solution does to modules (``random.randint = ...``,
``sys.modules['math'] = ...``), builtins or the prompt's helpers reaches the test.
The test process writes the report; when the solution process ends early it
leaves without one and the harness judges the solution's exit.

Within a solution process, what the child uses after the solution started is
bound beforehand (default arguments), so patching builtins or modules changes
nothing, and only the child itself reports: a forked descendant of the solution
that reaches the end leaves silently.
"""

import builtins
import json
import marshal
import os
import resource
import signal
import sys
import threading
import types

checks, confine = sys.modules["relaxtune_sandbox_checks"], sys.modules["relaxtune_sandbox_confine"]

SETUP_FAILED = 121  # a child's exit status when its sandbox could not be set up
_LENGTH = 8  # bytes of length before each message between the HumanEval processes


class NotPlain(BaseException):
    """A returned value that is not a plain builtin value (never caught by ``except Exception``)."""


class _CandidateRaised(BaseException):
    """In the test process: the candidate's call raised (``args[0]``: what, as ``_describe`` says)."""


class _SolutionEnded(BaseException):
    """In the test process: the solution process ended (its pipe closed)."""


def _open_std(fd: int, mode: str):
    return open(fd, mode, closefd=False, encoding="utf-8", errors="surrogateescape" if "r" in mode else "strict")


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__["__builtins__"] = builtins
    sys.modules[name] = module
    return module


def _describe(err: BaseException, job: dict, _type=type, _isinstance=isinstance, _str=str, _getattr=getattr,
              _int=int) -> dict:
    """What a solution (or the test) raised, for the harness (builtins bound beforehand)."""
    info = {"type": _type(err).__name__, "assertion": _isinstance(err, AssertionError),
            "exit": _isinstance(err, SystemExit), "errno": None}
    try:
        info["message"] = _str(err)[:300]
        errno = _getattr(err, "errno", None)
        info["errno"] = errno if _type(errno) is _int else None
    except BaseException:  # noqa: BLE001 - a hostile __str__ or errno
        info["message"] = info.get("message", "?")
    tb, line = err.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "test.py":
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is not None:
        info["test_line"] = job["test"].splitlines()[line - 1].strip()[:200]
    return info


def _not_plain_info(bad: str) -> dict:
    return {"type": "NotPlain", "message": f"returned a {bad}; only plain builtin values are compared",
            "assertion": False, "exit": False, "errno": None}


def _send(fd: int, message, _dumps=marshal.dumps, _write=os.write) -> None:
    """Write ``message`` (plain values) on ``fd``, its length first. Raises ValueError when
    ``marshal`` cannot write it (nested too deep)."""
    data = _dumps(message)
    data = len(data).to_bytes(_LENGTH, "little") + data
    while data:
        data = data[_write(fd, data):]


def _receive(fd: int, _read=os.read, _loads=marshal.loads):
    """The next message on ``fd``. Raises EOFError when the other process is gone."""
    parts, size, want = [], None, _LENGTH
    while want:
        chunk = _read(fd, min(want, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        want -= len(chunk)
        if want == 0 and size is None:
            size = int.from_bytes(b"".join(parts), "little")
            parts, want = [], size
    return _loads(b"".join(parts))


def _run_solution(job: dict, args: list, _exec=exec, _compile=compile, _isinstance=isinstance, _getattr=getattr,
                  not_plain=checks.not_plain, prelude=checks.prelude(), _threads=threading.enumerate,
                  _main=threading.main_thread(), NotPlain=NotPlain, not_plain_info=_not_plain_info):
    """Run a LiveCodeBench solution for one test; returns the payload to report (call-based:
    the value). A stdin program ends as a process does: after its non-daemon threads."""
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
    bad = not_plain(value)
    if bad is not None:
        raise NotPlain(not_plain_info(bad)["message"])
    return value


def _serve_candidate(job: dict, calls: int, results: int, me: int, _exec=exec, _compile=compile, send=_send,
                     receive=_receive, describe=_describe, not_plain=checks.not_plain, not_plain_info=_not_plain_info,
                     _getpid=os.getpid, _exit=os._exit) -> None:
    """The HumanEval solution process (pid ``me``): run the program (prompt + completion), say
    whether it loaded, then answer each call of the test process until it closes the pipe.
    A forked copy of the solution never answers (it leaves at its first message)."""
    scope = _module("candidate").__dict__  # not __main__: the official harness runs no __main__ block
    try:
        _exec(_compile(job["code"], "solution.py", "exec"), scope)
        if job["entry_point"] not in scope:
            raise NameError(f"name {job['entry_point']!r} is not defined")
        candidate, reply = scope[job["entry_point"]], ("ok", None)
    except BaseException as err:  # noqa: BLE001 - every way a solution can fail is reported
        candidate, reply = None, ("raised", describe(err, job))
    while True:
        if _getpid() != me:
            _exit(0)
        try:
            send(results, reply)
        except ValueError as err:  # a value nested too deep to send
            send(results, ("raised", {"type": "ValueError", "message": str(err), "assertion": False, "exit": False,
                                      "errno": None}))
        if candidate is None:
            return
        try:
            call_args, call_kwargs = receive(calls)
        except EOFError:
            return
        try:
            value = candidate(*call_args, **call_kwargs)
            bad = not_plain(value)
            reply = ("ok", value) if bad is None else ("raised", not_plain_info(bad))
        except BaseException as err:  # noqa: BLE001
            reply = ("raised", describe(err, job))


def _check_in_test_process(job: dict, calls: int, results: int):
    """The HumanEval test process: the prompt and the test in this pristine interpreter, the
    candidate a proxy to the solution process. Returns the report's ``(state, info)``.
    Raises _SolutionEnded when the solution process ends."""

    def receive():
        try:
            return _receive(results)
        except EOFError:
            raise _SolutionEnded from None

    state, info = receive()  # did the program load?
    if state != "ok":
        return "raised", info

    def candidate(*args, **kwargs):
        _send(calls, (args, kwargs))
        state, payload = receive()
        if state != "ok":
            raise _CandidateRaised(payload)
        return payload

    tests = {"__name__": "humaneval_test"}
    try:
        exec(compile(job["prompt"], "prompt.py", "exec"), tests)
        tests[job["entry_point"]] = candidate  # a test may call the entry by name (HumanEval/33)
        exec(compile(job["test"], "test.py", "exec"), tests)
        tests["check"](candidate)
    except _CandidateRaised as err:
        return "raised", err.args[0]
    except _SolutionEnded:
        raise
    except BaseException as err:  # noqa: BLE001 - an assertion of the test, or an error of the test itself
        return "raised", _describe(err, job)
    return "ok", None


def _humaneval(job: dict, token: bytearray, report: int, streams: tuple, _fork=os.fork, _close=os.close,
               _exit=os._exit, _waitpid=os.waitpid) -> None:
    """Fork the test process, then run the solution here (see module doc) and wait for the
    test process to report; never returns. The solution process has neither the report
    file nor the token (zeroed in its memory)."""
    calls_r, calls_w = os.pipe()
    results_r, results_w = os.pipe()
    me = os.getpid()
    tester = _fork()
    if tester == 0:
        _close(calls_r)
        _close(results_w)
        try:
            state, info = _check_in_test_process(job, calls_w, results_r)
        except _SolutionEnded:
            _exit(0)
        data = marshal.dumps((bytes(token), state, info, None))
        while data:
            data = data[os.write(report, data):]
        _exit(0)
    for i in range(len(token)):
        token[i] = 0
    for fd in (calls_w, results_r, report):
        _close(fd)
    try:
        _serve_candidate(job, calls_r, results_w, me)
        for stream in streams:
            stream.flush()
    finally:
        try:
            _waitpid(tester, 0)
        except ChildProcessError:  # the solution reaped it (it had reported)
            pass
        _exit(0)


def run_test(job: dict, files: dict, token: bytearray, nonce: bytearray, uid, _dump=marshal.dumps, _write=os.write,
             _exit=os._exit, _getpid=os.getpid) -> None:
    """The forked child: set up, drop privileges, run, report ``(token, status, info, payload)``; never returns."""
    for i in range(len(nonce)):
        nonce[i] = 0
    try:
        report = os.open(files["report"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        stdin = {"stdin": (files["input"], os.O_RDONLY), "call": (os.devnull, os.O_RDONLY),
                 "humaneval": (os.devnull, os.O_WRONLY)}[job["kind"]]
        for target, (path, flags) in enumerate(
                [stdin, (files["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
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
        streams, me = (sys.stdout, sys.stderr), os.getpid()
    except BaseException as err:  # noqa: BLE001 - the harness reports a grader error
        os.write(2, f"sandbox set-up failed: {type(err).__name__}: {err}\n".encode())
        os._exit(SETUP_FAILED)
    if job["kind"] == "humaneval":
        _humaneval(job, token, report, streams)
    token = bytes(token)
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
        if _getpid() != me:  # a forked copy of the solution reached the end: only the child reports
            _exit(0)
        try:
            data = _dump(message)
        except ValueError as err:  # a value nested too deep to send back
            data = _dump((token, "raised", {"type": "ValueError", "message": str(err), "exit": False,
                                            "assertion": False, "errno": None}, None))
        while data:
            data = data[_write(report, data):]
    finally:
        _exit(0)
