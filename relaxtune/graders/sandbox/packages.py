"""The interpreter and the packages a solution runs with, the same under every containment.

Both the bubblewrap sandbox and the process-group fallback (``launcher``) run solutions
with one interpreter (``interpreter``) and, beyond its own standard library and
site-packages, exactly one more package: numpy (LiveCodeBench's runner imports it), from
one directory that holds nothing else (``SiteDir``): numpy and its bundled libraries
(``numpy.libs``), found by their resolved paths (a venv reached through a symlink is
followed to where it lies). The directory is ``relaxtune-site-<pid>-*`` in a temporary
directory every user can reach (``shared_tmp``: a ``TMPDIR`` under a closed home is passed
over); one left by a process that is gone is removed by the next.
When solutions run as another user (root's sandbox gives
each run a fresh uid) and that user cannot read them where they lie (a home directory
others cannot enter), they are copied, once per process, to a world-readable directory
(removed at exit). The fallback puts that directory on ``sys.path``; bubblewrap binds
each entry's resolved path under ``/opt/site``. So a verdict does not depend on which
containment runs it, nor on where the venv lives.

numpy is offered only to an interpreter of this process's version (its compiled
modules are built for it); otherwise neither containment has it, and ``SiteDir.note``
says why.

Standard library only (the package is also run on its own, by another user).
"""

from __future__ import annotations

import atexit
import glob
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

__all__ = ["PACKAGES", "SiteDir", "interpreter", "readable_by_all", "shared_tmp", "site_dir", "version_of"]

PACKAGES = ("numpy", "numpy.libs")
SYSTEM_PYTHON = "/usr/bin/python3"
_lock = threading.Lock()
_made: dict = {}


def readable_by_all(path: str, tree: bool = False) -> bool:
    """Whether any user can reach ``path`` (resolved): every directory on the way
    searchable by others, the path readable (and searchable, a directory) by others; with
    ``tree``, every file and directory below it too. False when it does not exist."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    try:
        if not all(os.stat(os.sep.join(parts[:i]) or os.sep).st_mode & stat.S_IXOTH for i in range(1, len(parts))):
            return False
        if not _open_to_others(real):
            return False
        if tree and os.path.isdir(real):
            for top, dirs, files in os.walk(real):
                for name in dirs + files:
                    if not _open_to_others(os.path.join(top, name)):
                        return False
    except OSError:
        return False
    return True


def shared_tmp() -> str:
    """A temporary directory every user can reach, for what a sandbox's other user reads
    (the package directory, the harness's files, the fallback's run directories):
    ``tempfile.gettempdir()`` when others can pass through every directory on its way and
    we can write there, else the first of ``/tmp``, ``/var/tmp``, ``/dev/shm`` that is so
    (a ``TMPDIR`` under a home others cannot enter would stop a sandbox run as a fresh
    uid); ``gettempdir()`` when none is (the sandbox's probe then says why). Raises
    nothing."""
    own = tempfile.gettempdir()
    for path in (own, "/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(path) and readable_by_all(path) and os.access(path, os.W_OK | os.X_OK):
            return path
    return own


def _open_to_others(path: str) -> bool:
    mode = os.stat(path).st_mode
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need


def interpreter(other_user: bool) -> str | None:
    """The interpreter solutions run with (a resolved path): this process's own, or, when
    they run as another user who cannot execute it (under ``/root``), the system's
    ``/usr/bin/python3``; None when that user can execute neither."""
    own = os.path.realpath(sys.executable)
    if not other_user:
        return own
    for candidate in (own, SYSTEM_PYTHON):
        if (
            os.path.exists(candidate)
            and readable_by_all(candidate)
            and os.stat(os.path.realpath(candidate)).st_mode & stat.S_IXOTH
        ):
            return os.path.realpath(candidate)
    return None


def version_of(python: str) -> tuple[int, int] | None:
    """``python``'s (major, minor), asked of it (isolated mode); None when it does not run."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return tuple(sys.version_info[:2])
    try:
        run = subprocess.run(
            [python, "-I", "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
        )
        major, minor = map(int, run.stdout.split())
        return (major, minor) if run.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _package_dirs() -> list[str]:
    """numpy's package directory and its bundled libraries as this interpreter finds them,
    resolved; [] when numpy is not installed."""
    spec = importlib.util.find_spec("numpy")
    if spec is None or not spec.submodule_search_locations:
        return []
    package = os.path.realpath(list(spec.submodule_search_locations)[0])
    libs = os.path.join(os.path.dirname(package), "numpy.libs")
    return [p for p in (package, libs) if os.path.isdir(p)]


@dataclass(frozen=True)
class SiteDir:
    """The packages offered to solutions: ``path`` (a world-readable directory holding
    only them, links or copies; None when none is offered), ``sources`` (what each entry
    resolves to: the directories bubblewrap binds, by name), ``copied`` (whether they
    were copied for another user), and ``note`` ("" or why numpy is not offered)."""

    path: str | None
    sources: tuple[tuple[str, str], ...] = ()
    copied: bool = False
    note: str = ""


def site_dir(python: str, other_user: bool) -> SiteDir:
    """The directory of packages for solutions run by ``python`` (made once per process
    and argument pair, removed at exit; see module doc)."""
    key = (python, other_user)
    with _lock:
        if key not in _made:
            _made[key] = _make(python, other_user)
        return _made[key]


def _sweep() -> None:
    """Remove the package directories of processes that are gone (killed before their exit
    handler ran: a copy of numpy is some 70 MB)."""
    for path in glob.glob(os.path.join(shared_tmp(), "relaxtune-site-*-*")):
        try:
            owner = int(os.path.basename(path).split("-")[2])
        except (IndexError, ValueError):
            continue
        if owner != os.getpid() and not os.path.exists(f"/proc/{owner}"):
            shutil.rmtree(path, ignore_errors=True)


def _make(python: str, other_user: bool) -> SiteDir:
    dirs = _package_dirs()
    if not dirs:
        return SiteDir(None, note="numpy is not installed here")
    version = version_of(python)
    if version != tuple(sys.version_info[:2]):
        return SiteDir(
            None,
            note=f"numpy is not offered: the interpreter {python} is Python "
            f"{'.'.join(map(str, version)) if version else '(did not run)'}, numpy here is "
            f"built for {sys.version_info[0]}.{sys.version_info[1]}",
        )
    _sweep()
    target = tempfile.mkdtemp(prefix=f"relaxtune-site-{os.getpid()}-", dir=shared_tmp())
    atexit.register(shutil.rmtree, target, True)
    os.chmod(target, 0o755)
    copy = other_user and not all(readable_by_all(d, tree=True) for d in dirs)
    sources = []
    for d in dirs:
        entry = os.path.join(target, os.path.basename(d))
        if copy:
            shutil.copytree(d, entry, symlinks=True)  # compiled caches too: their source times are kept
            for top, subdirs, files in os.walk(entry):
                os.chmod(top, 0o755)
                for name in files:
                    path = os.path.join(top, name)
                    if not os.path.islink(path):
                        os.chmod(path, os.stat(path).st_mode & 0o777 | 0o444)
            sources.append((os.path.basename(d), entry))
        else:
            os.symlink(d, entry)
            sources.append((os.path.basename(d), d))
    return SiteDir(target, tuple(sources), copied=copy)
