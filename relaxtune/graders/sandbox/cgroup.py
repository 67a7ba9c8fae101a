"""A control group per sandbox run: the memory and process count of the whole process tree.

The launcher (host side) makes one group per run under the cgroup it runs in, sets
its limits, starts the sandbox inside it (``join_script``), reads what it used
(``usage``) and removes it once it is empty (``remove``). Both hierarchies are
handled: cgroup v2 (``memory.max``, ``memory.swap.max``, ``pids.max``; the
``oom_kill`` count of ``memory.events``; ``memory.peak``) and cgroup v1 (the
``memory`` and ``pids`` controllers: ``memory.limit_in_bytes``,
``memory.memsw.limit_in_bytes``, ``pids.max``; the ``oom_kill`` line of
``memory.oom_control``; ``memory.max_usage_in_bytes``). Where neither can be made
(no write access, controller not enabled) ``available()`` is False and the sandbox
falls back to a process count times address space budget.

Limits are the kernel's (Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/memory.rst).
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunGroup", "available", "create"]

ROOT = Path("/sys/fs/cgroup")


def _own(controller: str | None) -> Path | None:
    """The directory of this process's cgroup for ``controller`` (v1), or its v2 group (None)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller is None and names == "":
            base = ROOT if (ROOT / "cgroup.controllers").exists() else ROOT / "unified"
            return base / path.lstrip("/")
        if controller is not None and controller in names.split(","):
            return ROOT / controller / path.lstrip("/")
    return None


@dataclass
class RunGroup:
    """One run's cgroup directories (v2: one; v1: memory and pids) and its memory limit (bytes)."""

    version: int
    dirs: tuple[Path, ...]
    limit: int

    @property
    def procs(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join the group."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def join_script(self) -> list[str]:
        """A ``sh`` prefix that moves itself into the group, then execs the rest of the command."""
        moves = " && ".join(f'echo $$ > "{p}"' for p in self.procs)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "relaxtune-cgroup"]

    def _memory_dir(self) -> Path:
        return self.dirs[0]

    def usage(self) -> dict:
        """``{"oom_kills": int, "peak": bytes or None}`` of the group so far."""
        d = self._memory_dir()
        try:
            text = (d / ("memory.events" if self.version == 2 else "memory.oom_control")).read_text()
            kills = int(dict(line.split() for line in text.splitlines() if line.strip()).get("oom_kill", 0))
        except (OSError, ValueError):
            kills = 0
        try:
            peak = int((d / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")).read_text())
        except (OSError, ValueError):
            peak = None
        return {"oom_kills": kills, "peak": peak}

    def pids(self) -> list[int]:
        out = set()
        for p in self.procs:
            try:
                out.update(int(x) for x in Path(p).read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(out)

    def remove(self, wait: float = 10.0) -> None:
        """Kill whatever is left in the group, wait until it is empty, remove it."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            left = self.pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)
        for d in self.dirs:
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # still emptying
                    time.sleep(0.02)


def _write(path: Path, value) -> None:
    path.write_text(f"{value}\n")


def _make(version: int, memory: int, pids: int) -> RunGroup:
    """Raises OSError when the group cannot be made or limited."""
    name = f"relaxtune-{os.getpid()}-{secrets.token_hex(4)}"
    if version == 2:
        base = _own(None)
        if base is None or not (base / "cgroup.subtree_control").exists():
            raise OSError("no cgroup v2 group")
        enabled = (base / "cgroup.subtree_control").read_text().split()
        if not {"memory", "pids"} <= set(enabled):
            raise OSError(f"memory and pids are not enabled for children of {base}")
        d = base / name
        d.mkdir()
        group = RunGroup(2, (d,), memory)
        try:
            _write(d / "memory.max", memory)
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", 0)
            _write(d / "pids.max", pids)
        except OSError:
            group.remove()
            raise
        return group
    mem, pid = _own("memory"), _own("pids")
    if mem is None or pid is None:
        raise OSError("no cgroup v1 memory and pids controllers")
    dirs = (mem / name, pid / name)
    dirs[0].mkdir()
    try:
        dirs[1].mkdir()
    except OSError:
        dirs[0].rmdir()
        raise
    group = RunGroup(1, dirs, memory)
    try:
        _write(dirs[0] / "memory.limit_in_bytes", memory)
        if (dirs[0] / "memory.memsw.limit_in_bytes").exists():
            _write(dirs[0] / "memory.memsw.limit_in_bytes", memory)
        _write(dirs[1] / "pids.max", pids)
    except OSError:
        group.remove()
        raise
    return group


def _sweep() -> None:
    """Remove the empty groups, older than 10 minutes, of runs whose grader process is gone
    (a grader that was killed)."""
    for base in {_own(None), _own("memory"), _own("pids")} - {None}:
        try:
            entries = list(base.glob("relaxtune-*-*"))
        except OSError:
            continue
        for d in entries:
            try:
                owner = int(d.name.split("-")[1])
                stale = time.time() - d.stat().st_mtime > 600  # never a group another grader is setting up
                if owner != os.getpid() and stale and not Path(f"/proc/{owner}").exists():
                    d.rmdir()  # fails on a group that still holds processes
            except (ValueError, OSError):
                continue


@functools.lru_cache(maxsize=1)
def _version() -> int | None:
    """The hierarchy this host lets us make groups in (2, 1), or None (probed once)."""
    _sweep()
    for version in (2, 1):
        try:
            _make(version, 64 << 20, 8).remove()
            return version
        except OSError:
            continue
    return None


def available() -> bool:
    """Whether a memory and pids group can be made for each run on this host."""
    return _version() is not None


def create(memory: int, pids: int) -> RunGroup | None:
    """A new group holding the whole tree to ``memory`` bytes (swap included) and
    ``pids`` processes and threads; None where this host allows none."""
    version = _version()
    if version is None:
        return None
    try:
        return _make(version, memory, pids)
    except OSError:
        return None
