"""Confinement primitives for the sandbox harness (Linux, standard library only).

Mounts, capabilities and process flags through libc (``ctypes``), and the
clean-up of every process a test left behind: the harness
imports this module by path inside the sandbox, under whichever interpreter it
runs. Flag values are the kernel's (``<sys/mount.h>``, ``<linux/prctl.h>``,
``<linux/capability.h>``).
"""

import ctypes
import os
import re
import signal
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
_MOUNT_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 4, 24, 38
CLONE_NEWNET = 0x40000000
_CAP_VERSION_3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _mounts() -> list:
    """(mount point, per-mount flags) of every mount, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040 is a space
            out.append((point, sum(_MOUNT_FLAGS.get(opt, 0) for opt in fields[5].split(","))))
    return out


def private_filesystem(tmpfs_mb: int, notes: list) -> None:
    """Make every mount read-only and put private tmpfs (``tmpfs_mb`` MiB each) on
    /tmp, /var/tmp, /dev/shm, in this mount namespace only (propagation made
    private first). Mounts that refuse to turn read-only are named in ``notes``.

    Raises:
        OSError: /tmp could not be made private (the run must not go on).
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    stuck = []
    for point, flags in _mounts():
        if point == "/proc" or point.startswith("/proc/"):
            continue  # this namespace's own
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            stuck.append(point)
    if stuck:
        notes.append(f"{len(stuck)} mounts stayed writable ({', '.join(stuck[:3])})")
    for point in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(point):
            try:
                _mount("tmpfs", point, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=1777")
            except OSError:
                if point == "/tmp":
                    raise
                notes.append(f"{point} is not private")


def no_network(notes: list) -> None:
    """Root without the namespace tools: at least a network namespace of our own (no
    interfaces up), for this process and its children; a failure is named in ``notes``."""
    if _libc.unshare(CLONE_NEWNET) != 0:
        notes.append(f"network not isolated ({os.strerror(ctypes.get_errno())})")


def drop_capabilities() -> None:
    """Root of a user namespace: drop every capability, the bounding set included
    (so executing a program cannot bring them back).

    Raises:
        OSError: capset refused.
    """
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)  # this thread
    _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")


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
