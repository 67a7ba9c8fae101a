"""Confinement primitives for the sandbox harness (Linux, standard library only).

Capabilities and process flags through libc (``ctypes``), the CPU time of a
whole process tree, and the clean-up of every process a test left behind: the
harness imports this module by path inside the sandbox, under whichever
interpreter it runs. Mounts and namespaces are bubblewrap's (``bwrap.py``). Flag
values are the kernel's (``<linux/prctl.h>``, ``<sched.h>``); ``/proc/<pid>/stat``
fields are proc(5)'s.
"""

import ctypes
import os
import resource
import signal
import time

PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38
CLONE_NEWNET = 0x40000000
_TICK = os.sysconf("SC_CLK_TCK")
_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def no_network(notes: list) -> None:
    """Root without the namespace tools: at least a network namespace of our own (no
    interfaces up), for this process and its children; a failure is named in ``notes``."""
    if _libc.unshare(CLONE_NEWNET) != 0:
        notes.append(f"network not isolated ({os.strerror(ctypes.get_errno())})")


def no_new_privileges() -> None:
    """No setuid/setcap program can raise this process's privileges again.

    Raises:
        OSError: prctl refused.
    """
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def not_dumpable() -> None:
    """Other processes of the same user can neither ptrace this one nor open its /proc files."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _others(own_group: bool) -> list:
    """Process ids in /proc other than ours (only those of our process group when ``own_group``)."""
    me, pids = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            if own_group:
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if int(f.read().rpartition(")")[2].split()[2]) != os.getpgrp():
                            continue
                except (OSError, ValueError, IndexError):
                    continue
            pids.append(int(entry))
    return pids


def tree_cpu(namespaced: bool) -> float:
    """CPU seconds used so far by every process of this PID namespace but us (without
    one: of our process group), live or zombie, with what each reaped of its own
    children (``utime + stime + cutime + cstime``), plus what we reaped ourselves.
    Spinning children are charged to the test whether or not anyone waits for them."""
    ticks = 0
    for pid in _others(own_group=not namespaced):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            ticks += sum(int(x) for x in fields[11:15])
        except (OSError, ValueError, IndexError):
            continue
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ticks / _TICK + reaped.ru_utime + reaped.ru_stime


def kill_leftovers(namespaced: bool) -> None:
    """Kill every other process of this PID namespace (``kill(-1)`` from its PID 1), or,
    without one, of this process group, and reap them; repeated until none is left
    (a fork bomb forks while it is killed), at most 100 rounds. ``kill(-1)`` is used
    only by PID 1 (anywhere else it would reach every process of the host)."""
    namespaced = namespaced and os.getpid() == 1
    for _ in range(100):
        if namespaced:
            try:
                os.kill(-1, signal.SIGKILL)  # from PID 1: everyone in the namespace but us
            except ProcessLookupError:
                pass
        else:
            for pid in _others(own_group=True):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not _others(own_group=not namespaced):
            return
        time.sleep(0.002)
