"""The bubblewrap command line for one sandbox run (host side).

``bwrap`` (Debian package ``bubblewrap``) starts the harness in every new
namespace (user, mount, PID, network, IPC, UTS, cgroup), as PID 1 of its PID
namespace (``--as-pid-1``: every descendant dies with it), with no capability,
no further user namespace, a new session (no terminal to inject into) and
``--die-with-parent``. Its mount tree is fresh and minimal: a read-only root,
``/usr`` (and the ``/bin``, ``/lib``... links or directories that point into it)
read-only, a private ``/proc`` and ``/dev``, size-capped private tmpfs mounts on
``/tmp``, ``/var/tmp``, ``/dev/shm`` (the solution's) and ``/run/relaxtune`` (the
harness's own files: a solution that fills ``/tmp`` cannot stop its report), the
harness's files at ``/opt/relaxtune`` and the packages of ``packages.py`` (numpy: LiveCodeBench's
runner imports it) at ``/opt/site``, each bound by its resolved path. Nothing else of
the host exists inside: no ``/run``, ``/home``, ``/root``, ``/etc`` or host
``/tmp``, so no pathname socket or file of the host can be reached.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path

from . import packages

__all__ = ["command", "harness_dir", "HARNESS_FILES", "PRIVATE", "SITE", "CODE_DIR"]

HARNESS_FILES = ("harness.py", "child.py", "checks.py", "confine.py")
PRIVATE, SITE, CODE_DIR = "/run/relaxtune", "/opt/site", "/opt/relaxtune"
_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}
_copied: list[str] = []
_lock = threading.Lock()


def harness_dir() -> str:
    """A world-readable copy of the harness's files (made once per process, removed at exit,
    in ``packages.shared_tmp()``): the package may live where the sandbox's user cannot
    read (under ``/root``)."""
    with _lock:
        if not _copied:
            target = tempfile.mkdtemp(prefix="relaxtune-harness-", dir=packages.shared_tmp())
            os.chmod(target, 0o755)
            here = Path(__file__).parent
            for name in HARNESS_FILES:
                shutil.copyfile(here / name, Path(target) / name)
                os.chmod(Path(target) / name, 0o644)
            _copied.append(target)
            atexit.register(shutil.rmtree, target, True)
        return _copied[0]


def _top_level() -> list[str]:
    """``/bin``, ``/lib``... as on the host: a link into ``/usr`` (merged /usr) or a
    read-only directory."""
    args = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def command(
    bwrap: str, python: str, *, tmp_mb: int, private_mb: int, site: list[str], info_fd: int | None, as_root: bool
) -> list[str]:
    """The ``bwrap`` argv that starts ``python -I`` in the sandbox (see module doc); the
    caller appends the script (``f"{CODE_DIR}/harness.py"``).

    Args:
        bwrap: the ``bwrap`` executable.
        python: the interpreter (a path under ``/usr`` or bound read-only at its own path).
        tmp_mb: size of each of the solution's tmpfs mounts (MiB).
        private_mb: size of the harness's tmpfs (MiB).
        site: host directories (resolved: ``packages.SiteDir.sources``) bound under
            ``/opt/site`` by their names (numpy, numpy.libs).
        info_fd: a descriptor bwrap writes the sandbox's PID 1 (host pid) to, or None.
        as_root: the caller is root: the sandbox's user is uid 1000 (no capability),
            never root inside.
    """
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--cap-drop",
        "ALL",
    ]
    if as_root:
        args += ["--uid", "1000", "--gid", "1000"]
    args += ["--ro-bind", "/usr", "/usr", *_top_level(), "--proc", "/proc", "--dev", "/dev"]
    for point in ("/tmp", "/var/tmp", "/dev/shm"):
        args += ["--size", str(tmp_mb << 20), "--tmpfs", point]
    args += ["--size", str(private_mb << 20), "--tmpfs", PRIVATE]
    prefix = os.path.dirname(os.path.dirname(python))
    if prefix != "/" and os.path.commonpath([prefix, "/usr"]) != "/usr":  # its own prefix (pyenv, a venv's base)
        args += ["--ro-bind", prefix, prefix]
    args += ["--ro-bind", harness_dir(), CODE_DIR]
    for path in site:
        args += ["--ro-bind", path, f"{SITE}/{os.path.basename(path)}"]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    args += ["--remount-ro", "/", "--clearenv"]
    for key, value in _ENV.items():
        args += ["--setenv", key, value]
    return [*args, "--chdir", "/tmp", python, "-I"]
