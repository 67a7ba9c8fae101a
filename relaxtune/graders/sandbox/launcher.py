"""Start the sandbox harness for one solution and read back its verdict.

Containment (``sandbox_info()`` says which this host gives):

- ``bubblewrap``: the harness runs under ``bwrap`` (``bwrap.py``: every
  namespace, a fresh minimal mount tree, ``--die-with-parent``, PID 1 of its PID
  namespace so nothing it starts outlives it). As root the sandbox runs as a
  fresh unprivileged host uid per run. The whole process tree of the run is held
  to a memory and process budget by a control group of its own (``cgroup.py``:
  ``memory + overhead`` bytes, swap included, 64 processes) where the host lets
  us make one; otherwise by a process count (``RLIMIT_NPROC``, counted per user
  namespace) times the address space per process (``RLIMIT_AS``), sized to fit
  half this machine's memory. A memory-control kill anywhere in the tree is a
  ``memory`` verdict.
- ``process-group`` (no ``bwrap``, a sandbox that cannot start, or
  ``RELAXTUNE_SANDBOX=process-group``): the harness's own process group, rlimits,
  a scrubbed environment (and, as root, an unprivileged user and no network); a
  ``setsid()`` descendant can outlive the run, files can be written outside its
  directory and host sockets can be reached. Verdicts carry a note saying so, a
  warning is logged once, and ``relaxtune tasks validate`` says so.

Both run the same interpreter with the same packages (``packages.py``: numpy, by its
resolved path, copied where the sandbox's user could not read it), so a verdict
does not depend on the containment nor on where the venv lives. A bubblewrap that
cannot start (or cannot bind the packages) is found once, by a probe run with the
same binds: the fallback is used and the warning says why in one line, instead of
every solution being graded as an error.

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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import bwrap as bw
from . import cgroup, packages

__all__ = ["SandboxInfo", "Outcome", "sandbox_info", "run_job", "read_capped", "budget"]

HARNESS = Path(__file__).with_name("harness.py")
FRAME = "RELAXTUNE-VERDICT"
RESULT_CAP = 1 << 20  # bytes of harness stdout kept (one small JSON frame is expected)
STDERR_KEEP = 16 << 10  # bytes of stderr kept (the tail)
STDERR_CAP = 4 << 20  # bytes of stderr read before the run is killed
HARNESS_MB = 96  # the harness's own memory inside the run's group (interpreter, preludes, numpy)
CGROUP_PIDS = 64  # processes and threads of one run, with a control group
_SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxInfo:
    """How this host contains solutions: ``kind`` ("bubblewrap", "process-group"), the
    interpreter (the same for both kinds), ``bwrap``'s path, whether each run gets a
    fresh host uid (``fresh_uid``, as root, both kinds), whether the tree's memory is a
    control group's (``cgroup``), the package directories solutions see (``site``:
    numpy and its libraries, resolved, bound under ``/opt/site`` by bubblewrap) and the
    host directory holding only them (``site_dir``, on the fallback's ``sys.path``), and
    a ``note`` for verdicts ("" when containment is complete)."""

    kind: str
    python: str
    bwrap: str | None = None
    fresh_uid: bool = False
    cgroup: bool = False
    site: tuple[str, ...] = ()
    site_dir: str | None = None
    note: str = ""

    def describe(self) -> str:
        """One line: what contains a solution here, and its bounds."""
        if self.kind != "bubblewrap":
            return self.note + ("" if self.site else "; no numpy for solutions")
        tree = (
            "a memory and pids control group per run"
            if self.cgroup
            else "a process count x address space budget (no control group here)"
        )
        numpy = "numpy available" if self.site else "no numpy in the sandbox"
        return f"sandbox: bubblewrap ({self.bwrap}), every namespace, {tree}, {numpy}" + (
            f"; {self.note}" if self.note else ""
        )


@dataclass
class Outcome:
    """One harness run: the verdict ``frame`` (None when none arrived), how it ended
    (``ended``: "done", "backstop", "overflow"), the tail of its stderr, its exit status,
    notes, and the control group's count of memory kills and peak bytes (None without one)."""

    frame: dict | None
    ended: str
    stderr: str = ""
    returncode: int | None = None
    notes: list[str] = field(default_factory=list)
    oom_kills: int = 0
    peak_bytes: int | None = None
    memory_bound: int | None = None


def budget(memory: int) -> int:
    """Processes per test without a control group: half of this machine's memory
    divided by the address space per process, between 4 and 32."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return max(4, min(32, total // 2 // max(memory, 1)))


_PROBE = (
    "import sys\nsys.path.insert(0, {site!r})\ntry:\n    import numpy\n    got = 'numpy'\n"
    "except Exception as err:\n    got = type(err).__name__ + ': ' + str(err)\n"
    "print(*sys.version_info[:2])\nprint(got)\n"
)


def _probe(bwrap: str, python: str, fresh_uid: bool, site: tuple[str, ...]) -> tuple[bool, str]:
    """A trivial bubblewrap run with the packages bound as every run binds them: (started,
    "" or why not in one line: bwrap's own message) when it did not start; when it did,
    (True, "" or why numpy did not load inside)."""
    argv = bw.command(bwrap, python, tmp_mb=1, private_mb=1, site=list(site), info_fd=None, as_root=os.geteuid() == 0)
    uid = random.randrange(1 << 20, 1 << 30) if fresh_uid else None
    try:
        run = subprocess.run(
            [*argv, "-c", _PROBE.format(site=bw.SITE)],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": _SYSTEM_PATH},
            cwd="/",
            user=uid,
            group=uid,
            extra_groups=[] if uid else None,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return False, f"{type(err).__name__}: {err}"
    lines = run.stdout.splitlines()
    if run.returncode != 0 or len(lines) != 2:
        said = [line.strip() for line in run.stderr.splitlines() if line.strip()]
        return False, (said[-1] if said else f"exit status {run.returncode}")[:300]
    return True, "" if not site or lines[1] == "numpy" else f"numpy did not load in the sandbox: {lines[1][:200]}"


@functools.lru_cache(maxsize=1)
def sandbox_info() -> SandboxInfo:
    """The strongest containment this host offers (probed once per process; see module doc).

    Raises:
        ValueError: ``RELAXTUNE_SANDBOX`` set to anything but "process-group".
    """
    forced = os.environ.get("RELAXTUNE_SANDBOX", "")
    if forced not in ("", "process-group"):
        raise ValueError(f"RELAXTUNE_SANDBOX={forced!r}: the only accepted value is 'process-group'")
    root = os.geteuid() == 0
    shared = packages.interpreter(other_user=True) if root else None
    fresh = bool(root and shared)
    python = shared if fresh else packages.interpreter(other_user=False)
    site = packages.site_dir(python, other_user=fresh)
    binds = tuple(source for _, source in site.sources)
    bwrap = shutil.which("bwrap", path=_SYSTEM_PATH)
    why = "RELAXTUNE_SANDBOX=process-group" if forced else "no bubblewrap (Debian package bubblewrap)"
    if not forced and bwrap:
        started, said = _probe(bwrap, python, fresh, binds)
        if started:
            note = (
                ""
                if fresh or not root or cgroup.available()
                else "the process count is unbounded (root's sandbox without a control group)"
            )
            note = "; ".join(x for x in (note, said or site.note) if x)
            if said or site.note:
                log.warning("code grader: %s", said or site.note)
            return SandboxInfo(
                "bubblewrap",
                python,
                bwrap,
                fresh_uid=fresh,
                cgroup=cgroup.available(),
                site=() if said else binds,
                site_dir=None if said else site.path,
                note=note,
            )
        why = f"bubblewrap cannot start here: {said}"
    note = (
        f"sandbox: process group only ({why}): descendants that call setsid() can outlive the run, files "
        "can be left outside its directory and host sockets can be reached"
    )
    if root and not shared:
        note += "; solutions run as root"
    if site.note:
        note += f"; {site.note}"
    log.warning("code grader: %s; install bubblewrap where user namespaces are allowed for full containment", note)
    return SandboxInfo("process-group", python, fresh_uid=fresh, site=binds, site_dir=site.path, note=note)


def read_capped(
    proc: subprocess.Popen,
    data: bytes,
    deadline: float,
    *,
    result_cap: int = RESULT_CAP,
    stderr_keep: int = STDERR_KEEP,
    stderr_cap: int = STDERR_CAP,
) -> tuple[bytes, bytes, str]:
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
                        pending = pending[os.write(pipe.fileno(), pending[: 1 << 16]) :]
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
                frame = json.loads(rest[len(nonce) + 1 :])
            except json.JSONDecodeError:
                return None
            return frame if isinstance(frame, dict) and "verdict" in frame else None
    return None


def _stop(proc: subprocess.Popen, inner: int | None) -> None:
    """End the run and wait until nothing of it is left. Under bubblewrap the harness (PID 1
    of its namespace, host pid ``inner``) is killed and ``bwrap`` left to reap it: the
    kernel completes that only once every process of the namespace is gone, so when
    ``bwrap`` exits no descendant survives. Otherwise the process group is killed."""
    deadline = time.monotonic() + 10
    while inner is not None and not _exited(proc) and time.monotonic() < deadline:
        try:
            os.kill(inner, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        time.sleep(0.01)
    if proc.returncode is None:  # not reaped yet: its process group id is still ours
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _inner_pid(fd: int) -> int | None:
    """The sandbox's PID 1 as bwrap reported it on its info descriptor (None if it did not)."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 1 << 16)
        return int(json.loads(data)["child-pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def _overheads(job: dict) -> tuple[int, int]:
    """(tmpfs MiB for each of the solution's mounts, tmpfs MiB for the harness's files)."""
    return job["tmpfs_mb"], job["private_mb"]


def run_job(job: dict, *, backstop: float) -> Outcome:
    """Run one harness job (see ``harness.py``) and return its outcome.

    Args:
        job: the harness job (kind, code, tests, limits); its ``nonce`` and
            ``sandbox`` fields are filled in here.
        backstop: wall seconds for the whole run; past it everything is killed.

    Returns:
        ``Outcome``; ``frame`` is the harness's verdict, None when it sent none
        (killed at the backstop, output overflow, harness failure).

    Raises:
        OSError: the sandbox could not start.
    """
    info = sandbox_info()
    nonce = secrets.token_hex(16)
    boxed = info.kind == "bubblewrap"
    tmp_mb, private_mb = _overheads(job)
    group = None
    if boxed and info.cgroup:
        bound = job["memory"] + ((HARNESS_MB + private_mb + 3 * tmp_mb) << 20)
        group = cgroup.create(bound, CGROUP_PIDS)
    nproc = CGROUP_PIDS if group else budget(job["memory"])
    base = None if boxed else tempfile.mkdtemp(prefix="relaxtune-run-", dir=packages.shared_tmp())
    job = {
        **job,
        "nonce": nonce,
        "sandbox": {
            "bwrap": boxed,
            "base": base,
            "private": bw.PRIVATE if boxed else None,
            "site": (bw.SITE if boxed else info.site_dir) if info.site else None,
            "nproc": nproc,
            "uid": random.randrange(1 << 20, 1 << 30) if not boxed and info.fresh_uid else None,
        },
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "HOME": base or "/",
    }
    uid = random.randrange(1 << 20, 1 << 30) if boxed and info.fresh_uid else None
    info_r = info_w = None
    try:
        if boxed:
            info_r, info_w = os.pipe()
            argv = [
                *bw.command(
                    info.bwrap,
                    info.python,
                    tmp_mb=tmp_mb,
                    private_mb=private_mb,
                    site=list(info.site),
                    info_fd=info_w,
                    as_root=os.geteuid() == 0,
                ),
                f"{bw.CODE_DIR}/harness.py",
            ]
            if group:
                if uid is not None:
                    for procs in group.procs:
                        os.chown(procs, uid, uid)
                argv = [*group.join_script(), *argv]
        else:
            os.chmod(base, 0o755)
            argv = [info.python, "-I", str(HARNESS)]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=base or "/",
            start_new_session=True,
            user=uid,
            group=uid,
            extra_groups=[] if uid is not None else None,
            pass_fds=[info_w] if info_w is not None else [],
        )
        if info_w is not None:
            os.close(info_w)
            info_w = None
        try:
            out, err, ended = read_capped(proc, json.dumps(job).encode(), time.monotonic() + backstop)
        finally:
            _stop(proc, _inner_pid(info_r) if info_r is not None else None)
            info_r = None
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if not pipe.closed:
                    pipe.close()
    finally:
        for fd in (info_r, info_w):
            if fd is not None:
                os.close(fd)
        if base:
            shutil.rmtree(base, ignore_errors=True)
        usage = group.usage() if group else {"oom_kills": 0, "peak": None}
        if group:
            group.remove()
    frame = _parse_frame(out, nonce) if ended == "done" else None
    notes = list(frame.get("notes", [])) if frame else []
    if info.note:
        notes.append(info.note)
    return Outcome(
        frame,
        ended,
        err.decode("utf-8", "replace"),
        proc.returncode,
        notes,
        usage["oom_kills"],
        usage["peak"],
        group.limit if group else nproc * job["memory"],
    )
