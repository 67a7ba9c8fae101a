"""Start the sandbox harness for one solution and read back its verdict.

Containment, strongest first (``sandbox_info()`` says which this host gives):

- ``namespaces`` (root): util-linux ``unshare --pid --fork --kill-child
  --mount-proc --net --ipc``; the harness is PID 1 of the new PID namespace,
  so every descendant, ``setsid()`` or not, dies when it ends, and ``unshare``
  exits only once the namespace is empty (``_stop``). Tests run as a per-run
  unprivileged user id (process limits are per user: concurrent runs never
  share them).
- ``user-namespaces`` (non-root where the kernel allows it): the same inside a
  user namespace, tests as its root with every capability dropped.
- ``process-group`` (neither, or ``RELAXTUNE_SANDBOX=process-group``): the
  harness's own process group, rlimits, a scrubbed environment (and, as root,
  an unprivileged user and no network); a ``setsid()``
  descendant can outlive the run and files can be written outside its
  directory. Verdicts carry a note saying so and a warning is logged once.

Every pipe from the sandbox is read through a capped reader (kept bytes and
total bytes bounded) and the whole run is killed at the ``backstop`` (wall
seconds), so the grader's own memory and time stay bounded whatever runs inside.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SandboxInfo", "Outcome", "sandbox_info", "run_job", "read_capped"]

HARNESS = Path(__file__).with_name("harness.py")
FRAME = "RELAXTUNE-VERDICT"
RESULT_CAP = 1 << 20  # bytes of harness stdout kept (one small JSON frame is expected)
STDERR_KEEP = 16 << 10  # bytes of stderr kept (the tail)
STDERR_CAP = 4 << 20  # bytes of stderr read before the run is killed
_UNSHARE = ["--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private", "--net", "--ipc"]
_SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxInfo:
    """How this host contains solutions: ``kind`` ("namespaces", "user-namespaces",
    "process-group"), the command prefix, the interpreter, whether tests ``drop``
    to an unprivileged user id (as root), and a ``note`` for verdicts ("" when
    containment is complete)."""

    kind: str
    prefix: tuple[str, ...]
    python: str
    drop: bool = False
    note: str = ""


@dataclass
class Outcome:
    """One harness run: the verdict ``frame`` (None when none arrived), how it ended
    (``ended``: "done", "backstop", "overflow"), the tail of its stderr, its exit status."""

    frame: dict | None
    ended: str
    stderr: str = ""
    returncode: int | None = None
    notes: list[str] = field(default_factory=list)


def _world_executable(path: str) -> bool:
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    dirs = [os.sep.join(parts[:i]) or os.sep for i in range(1, len(parts))]
    return all(os.stat(d).st_mode & 0o001 for d in dirs) and bool(os.stat(real).st_mode & 0o001)


def _python_for_other_users() -> str | None:
    """An interpreter (and standard library) an unprivileged user can run: this one
    if world-executable, else the system ``/usr/bin/python3``."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(candidate) and _world_executable(candidate):
            return candidate
    return None


def _works(prefix: list[str]) -> bool:
    try:
        run = subprocess.run([*prefix, "true"], capture_output=True, timeout=20, env={"PATH": _SYSTEM_PATH})
        return run.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=1)
def sandbox_info() -> SandboxInfo:
    """The strongest containment this host offers (probed once per process; see module doc)."""
    unshare = shutil.which("unshare", path=_SYSTEM_PATH)
    forced = os.environ.get("RELAXTUNE_SANDBOX", "")
    root = os.geteuid() == 0
    python = _python_for_other_users() if root else sys.executable
    if forced not in ("", "process-group"):
        raise ValueError(f"RELAXTUNE_SANDBOX={forced!r}: the only accepted value is 'process-group'")
    if not forced and unshare and python:
        if root and _works([unshare, *_UNSHARE]):
            return SandboxInfo("namespaces", (unshare, *_UNSHARE), python, drop=True)
        userns = [unshare, "--user", "--map-root-user", *_UNSHARE]
        if not root and _works(userns):
            return SandboxInfo("user-namespaces", tuple(userns), python)
    why = "RELAXTUNE_SANDBOX=process-group" if forced else (
        "no util-linux unshare" if not unshare else "no interpreter other users can run" if not python
        else "namespaces refused")
    note = (f"sandbox: process group only ({why}): descendants that call setsid() can outlive the run and files "
            "can be left outside its directory")
    if root and not python:
        note += "; solutions run as root"
    log.warning("code grader: %s; install util-linux or run where namespaces are allowed for full containment", note)
    return SandboxInfo("process-group", (), python or sys.executable, drop=bool(root and python), note=note)


def read_capped(proc: subprocess.Popen, data: bytes, deadline: float, *, result_cap: int = RESULT_CAP,
                stderr_keep: int = STDERR_KEEP, stderr_cap: int = STDERR_CAP) -> tuple[bytes, bytes, str]:
    """Feed ``data`` to ``proc``'s stdin while reading its stdout and stderr, bounded.

    Keeps at most ``result_cap`` bytes of stdout and the last ``stderr_keep`` bytes
    of stderr; stops ("overflow") as soon as stdout passes ``result_cap`` or stderr
    passes ``stderr_cap`` bytes in total, and ("backstop") at ``deadline``
    (``time.monotonic()`` seconds). Stops ("done") when both pipes close, or
    shortly after the process ends while a descendant still holds them.

    Returns:
        (stdout kept, stderr tail, how it ended).
    """
    sel = selectors.DefaultSelector()
    out, err, err_total, pending, ended_at = bytearray(), bytearray(), 0, memoryview(data), None
    readers = {proc.stdout, proc.stderr}
    for pipe in readers:
        sel.register(pipe, selectors.EVENT_READ)
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    try:
        while readers:
            now = time.monotonic()
            if now >= deadline:
                return bytes(out), bytes(err), "backstop"
            if ended_at is None and _exited(proc):
                ended_at = now
            if ended_at is not None and now - ended_at > 0.5:
                break  # the process is gone; a descendant that kept the pipes is not waited for
            for key, _ in sel.select(min(deadline - now, 0.1)):
                pipe = key.fileobj
                if pipe is proc.stdin:
                    try:
                        pending = pending[os.write(pipe.fileno(), pending[: 1 << 16]):]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(pipe)
                        pipe.close()
                    continue
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:
                    sel.unregister(pipe)
                    readers.discard(pipe)
                elif pipe is proc.stdout:
                    out += chunk
                    if len(out) > result_cap:
                        return bytes(out[:result_cap]), bytes(err), "overflow"
                else:
                    err_total += len(chunk)
                    err = (err + chunk)[-stderr_keep:]
                    if err_total > stderr_cap:
                        return bytes(out), bytes(err), "overflow"
        return bytes(out), bytes(err), "done"
    finally:
        sel.close()


def _exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has ended, without reaping it (its process group id stays valid to kill)."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _parse_frame(out: bytes, nonce: str) -> dict | None:
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        head, _, rest = line.partition(" ")
        if head == FRAME and rest.startswith(nonce + " "):
            try:
                frame = json.loads(rest[len(nonce) + 1:])
            except json.JSONDecodeError:
                return None
            return frame if isinstance(frame, dict) and "verdict" in frame else None
    return None


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (``/proc/<pid>/task/*/children``, else a scan of ``/proc``)."""
    try:
        return [int(c) for task in os.listdir(f"/proc/{pid}/task")
                for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except OSError:
        pass
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return found


def _stop(proc: subprocess.Popen, namespaced: bool) -> None:
    """End the run and wait until nothing of it is left. With namespaces the harness (PID 1
    of its namespace, ``unshare``'s child) is killed and ``unshare`` left to reap it: the
    kernel completes that only once every process of the namespace is gone, so when
    ``unshare`` exits no descendant survives. Otherwise the process group is killed."""
    deadline = time.monotonic() + 10
    while namespaced and not _exited(proc) and time.monotonic() < deadline:
        for pid in _children(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    if proc.returncode is None:  # not reaped yet: its process group id is still ours
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def run_job(job: dict, *, backstop: float) -> Outcome:
    """Run one harness job (see ``harness.py``) and return its outcome.

    Args:
        job: the harness job (kind, code, tests, limits); its ``nonce`` and
            ``sandbox`` fields are filled in here.
        backstop: wall seconds for the whole run; past it everything is killed.

    Returns:
        ``Outcome``; ``frame`` is the harness's verdict, None when it sent none
        (killed at the backstop, output overflow, harness failure).
    """
    info = sandbox_info()
    nonce = secrets.token_hex(16)
    base = None if info.kind != "process-group" else tempfile.mkdtemp(prefix="relaxtune-run-")
    job = {**job, "nonce": nonce, "sandbox": {
        "namespaces": info.kind != "process-group", "userns": info.kind == "user-namespaces", "base": base,
        "uid": random.randrange(1 << 20, 1 << 30) if info.drop else None}}
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "HOME": base or "/"}
    if base:
        os.chmod(base, 0o755)
    try:
        proc = subprocess.Popen([*info.prefix, info.python, "-s", str(HARNESS)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=base or "/",
                                start_new_session=True)
        try:
            out, err, ended = read_capped(proc, json.dumps(job).encode(), time.monotonic() + backstop)
        finally:
            _stop(proc, namespaced=info.kind != "process-group")
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if not pipe.closed:
                    pipe.close()
    finally:
        if base:
            shutil.rmtree(base, ignore_errors=True)
    frame = _parse_frame(out, nonce) if ended == "done" else None
    notes = list(frame.get("notes", [])) if frame else []
    if info.note:
        notes.append(info.note)
    return Outcome(frame, ended, err.decode("utf-8", "replace"), proc.returncode, notes)
