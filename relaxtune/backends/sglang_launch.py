"""Start and stop the plain SGLang servers relaxtune talks to, on a GPU host or a CPU host.

SGLang pins its own torch and transformers, so it lives in an environment of its
own: ``python`` names that environment's interpreter (``relaxtune serve --python``;
``scripts/sglang_env.sh`` builds one for a CPU host from PyPI). relaxtune installs
nothing there. Servers listen on loopback only.

On a CPU host (``docs/reference/sglang-cpu.md``) a server runs with
``SGLANG_USE_CPU_ENGINE=1`` and the flags ``CPU_FLAGS``; the pure-torch ``sgl_kernel``
stand-in (``relaxtune.backends.sglang_cpu``) goes first on its ``PYTHONPATH`` unless
the CPU has Intel AMX and SGLang's environment has a compiled CPU build of the
kernels (which PyPI does not have): with the stand-in, SGLang runs each layer's
torch code, AMX or not. Each server starts in a process group of its own, and
stopping it signals the whole group (SIGTERM, then SIGKILL after a grace period), so
its scheduler and detokenizer processes go with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import httpx

from .sglang_cpu import KERNEL_DIR, cpu_has_amx, has_cpu_kernel

__all__ = [
    "ServerSpec",
    "ServerProcess",
    "launch",
    "wait_healthy",
    "check_sglang",
    "server_env",
    "host_device",
    "SGLANG_VERSION",
    "CPU_FLAGS",
    "port_in_use",
]

SGLANG_VERSION = "0.5.23"
# sglang-cpu.md's launch flags: no overlap scheduler, a KV pool and context that fit a small host
CPU_FLAGS = ("--disable-overlap-schedule", "--max-total-tokens", "16384", "--context-length", "4096")


@dataclass(frozen=True)
class ServerSpec:
    """One server: model path, port, static memory fraction (GPU), extra launch args."""

    model: str
    port: int
    mem_fraction: float = 0.4
    extra: tuple[str, ...] = ()

    def command(self, python: str = sys.executable, device: str = "cuda") -> list[str]:
        """The ``python -m sglang.launch_server`` command line (no speculative flags
        unless ``extra`` has them): ``CPU_FLAGS`` on ``device == "cpu"``, else
        ``--mem-fraction-static``."""
        base = [
            python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--sampling-defaults",
            "openai",
        ]
        if device == "cpu":
            return [*base, *CPU_FLAGS, *self.extra]
        return [*base, "--mem-fraction-static", str(self.mem_fraction), *self.extra]


def host_device() -> str:
    """``"cuda"`` where an NVIDIA GPU is visible (``/dev/nvidia0`` or ``nvidia-smi``), else ``"cpu"``."""
    return "cuda" if Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") else "cpu"


def server_env(
    device: str,
    base: dict | None = None,
    amx: bool | None = None,
    python: str = sys.executable,
    kernel: bool | None = None,
) -> dict[str, str]:
    """The environment of a server process: ``base`` (default ``os.environ``), plus on a
    CPU host ``SGLANG_USE_CPU_ENGINE=1`` and ``KERNEL_DIR`` first on ``PYTHONPATH``, unless
    the CPU has AMX (``amx`` default: this CPU's ``cpu_has_amx()``) and SGLang's
    interpreter ``python`` has a compiled CPU build of ``sgl_kernel`` (``kernel``
    default: ``has_cpu_kernel``, asked only on an AMX CPU). Without that build an AMX CPU
    needs the stand-in as much as any: SGLang imports ``sgl_kernel`` on CPU unconditionally."""
    env = dict(os.environ if base is None else base)
    if device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        real = (cpu_has_amx() if amx is None else amx) and (
            has_cpu_kernel(python, env.get("PYTHONPATH")) if kernel is None else kernel
        )
        if not real:
            env["PYTHONPATH"] = os.pathsep.join([str(KERNEL_DIR), *filter(None, [env.get("PYTHONPATH")])])
    return env


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something already listens on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


class ServerProcess:
    """A started server: its spec, process (leader of its own process group) and log file."""

    def __init__(self, spec: ServerSpec, proc: subprocess.Popen, log: Path) -> None:
        self.spec, self.proc, self.log = spec, proc, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of the server's log ('' when unreadable)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        """Whether any process of the server's group is still there."""
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; reap the leader. Idempotent."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 10)
            while time.monotonic() < deadline:
                self.proc.poll()
                if not self.alive():
                    return
                time.sleep(0.2)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def wait_healthy(
    url: str, timeout: float = 600.0, proc: subprocess.Popen | None = None, server: ServerProcess | None = None
) -> None:
    """Poll ``GET /health`` until 200.

    Raises:
        RuntimeError: the process exited, or ``timeout`` seconds passed; with ``server``,
            the message ends with the server's last log lines.
    """
    proc = server.proc if server is not None else proc
    tail = (lambda: f"; its last log lines ({server.log}):\n{server.tail()}") if server is not None else (lambda: "")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with code {proc.returncode} before it was ready{tail()}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} did not become ready within {timeout:.0f} s{tail()}")


# the installed distribution's version without importing SGLang (its import takes minutes on a busy CPU);
# a package without distribution metadata is imported for its __version__
_VERSION_PROBE = """
import importlib.metadata, importlib.util, sys
if importlib.util.find_spec("sglang") is None:
    sys.exit(1)
try:
    print(importlib.metadata.version("sglang"))
except importlib.metadata.PackageNotFoundError:
    import sglang
    print(sglang.__version__)
"""


def check_sglang(python: str = sys.executable, allow_other_version: bool = False, env: dict | None = None) -> str:
    """The SGLang version ``python`` imports, checked against the pinned one.

    relaxtune reads SGLang's responses as ``SGLANG_VERSION`` writes them (key
    names, null entries, rewritten ids, live thresholds): another version may
    differ silently.

    Raises:
        RuntimeError: SGLang is not importable by ``python``, or (unless
            ``allow_other_version``) its version is not ``SGLANG_VERSION``.
    """
    try:
        found = subprocess.run([python, "-c", _VERSION_PROBE], capture_output=True, text=True, env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"cannot run {python} to find SGLang: {err}") from None
    if found.returncode != 0:
        raise RuntimeError(
            f"SGLang is not installed for {python}: pip install 'relaxtune[sglang]' "
            f"(sglang=={SGLANG_VERSION}, in its own environment; on a CPU host "
            "scripts/sglang_env.sh builds one), then pass its python with --python"
        )
    version = found.stdout.strip().splitlines()[-1] if found.stdout.strip() else "unknown"
    if version != SGLANG_VERSION:
        message = (
            f"SGLang {version} is installed for {python}, but relaxtune is built and tested against "
            f"sglang=={SGLANG_VERSION} (response layouts change between versions)"
        )
        if not allow_other_version:
            raise RuntimeError(
                f"{message}: pip install 'sglang=={SGLANG_VERSION}', or pass --allow-other-sglang to run it anyway"
            )
        warnings.warn(message, stacklevel=2)
    return version


def start_server(spec: ServerSpec, python: str, device: str, log: Path, env: dict) -> ServerProcess:
    """Start one server in a process group of its own, its output appended to ``log``.

    Raises:
        RuntimeError: something already listens on the spec's port.
    """
    if port_in_use(spec.port):
        raise RuntimeError(
            f"port {spec.port} is already in use on 127.0.0.1: stop what listens there or "
            "choose another --port (relaxtune would otherwise talk to that server)"
        )
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            spec.command(python, device),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return ServerProcess(spec, proc, log)


@contextlib.contextmanager
def launch(
    servers: list[ServerSpec],
    python: str = sys.executable,
    timeout: float = 600.0,
    log_dir: str | None = None,
    allow_other_version: bool = False,
    device: str = "auto",
    processes: list | None = None,
):
    """Start ``servers``, wait until every one is ready, yield their URLs, stop them on exit
    (also on an exception or KeyboardInterrupt: every process group is stopped).

    Args:
        python: the interpreter of SGLang's environment.
        timeout: seconds each server may take to become ready.
        log_dir: where the logs go (``sglang-<port>.log``); default a temporary folder,
            removed on exit.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"`` (``host_device()``).
        processes: a list that receives the ``ServerProcess`` objects (for tests and callers
            that watch or restart them).

    Raises:
        RuntimeError: as ``check_sglang``; a port is taken; a server exits or is not ready
            within ``timeout`` (with its last log lines).
    """
    device = host_device() if device == "auto" else device
    env = server_env(device, python=python)
    check_sglang(python, allow_other_version, env)
    tmp = None if log_dir else tempfile.mkdtemp(prefix="relaxtune-sglang-")
    folder = Path(log_dir or tmp)
    folder.mkdir(parents=True, exist_ok=True)
    started: list[ServerProcess] = [] if processes is None else processes
    try:
        for s in servers:
            started.append(start_server(s, python, device, folder / f"sglang-{s.port}.log", env))
        for p in started:
            wait_healthy(p.url, timeout, server=p)
        yield [p.url for p in started]
    finally:
        for p in started:
            p.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
