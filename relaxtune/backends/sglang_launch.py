"""Start and stop the two plain SGLang servers relaxtune talks to (GPU hosts).

SGLang is an optional extra pinned to one version (``pip install
'relaxtune[sglang]'``; it needs its own environment on the GPU host: it pins
its own torch and transformers). Servers listen on loopback only.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass

import httpx

__all__ = ["ServerSpec", "launch", "wait_healthy", "check_sglang", "SGLANG_VERSION"]

SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True)
class ServerSpec:
    """One server: model path, port, static memory fraction, extra launch args."""

    model: str
    port: int
    mem_fraction: float = 0.4
    extra: tuple[str, ...] = ()

    def command(self, python: str = sys.executable) -> list[str]:
        """The ``python -m sglang.launch_server`` command line (no speculative flags)."""
        return [python, "-m", "sglang.launch_server", "--model-path", self.model, "--host", "127.0.0.1",
                "--port", str(self.port), "--mem-fraction-static", str(self.mem_fraction),
                "--sampling-defaults", "openai", *self.extra]


def wait_healthy(url: str, timeout: float = 600.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``GET /health`` until 200.

    Raises:
        RuntimeError: the process exited, or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"{url} did not become healthy within {timeout:.0f} s")


def check_sglang(python: str = sys.executable, allow_other_version: bool = False) -> str:
    """The SGLang version ``python`` imports, checked against the pinned one.

    relaxtune reads SGLang's responses as ``SGLANG_VERSION`` writes them (key
    names, null entries, rewritten ids, live thresholds): another version may
    differ silently.

    Raises:
        RuntimeError: SGLang is not importable by ``python``, or (unless
            ``allow_other_version``) its version is not ``SGLANG_VERSION``.
    """
    found = subprocess.run([python, "-c", "import sglang; print(sglang.__version__)"], capture_output=True, text=True)
    if found.returncode != 0:
        raise RuntimeError(f"SGLang is not installed for {python}: pip install 'relaxtune[sglang]' "
                           f"(sglang=={SGLANG_VERSION}, in its own environment on a GPU host)")
    version = found.stdout.strip().splitlines()[-1] if found.stdout.strip() else "unknown"
    if version != SGLANG_VERSION:
        message = (f"SGLang {version} is installed for {python}, but relaxtune is built and tested against "
                   f"sglang=={SGLANG_VERSION} (response layouts change between versions)")
        if not allow_other_version:
            raise RuntimeError(f"{message}: pip install 'sglang=={SGLANG_VERSION}', or pass --allow-other-sglang "
                               "to run it anyway")
        warnings.warn(message, stacklevel=2)
    return version


@contextlib.contextmanager
def launch(servers: list[ServerSpec], python: str = sys.executable, timeout: float = 600.0, log_dir: str | None = None,
           allow_other_version: bool = False):
    """Start ``servers``, wait for health, yield their URLs, stop them on exit.

    Raises:
        RuntimeError: as ``check_sglang``, or a server fails to start.
    """
    check_sglang(python, allow_other_version)
    procs = []
    try:
        for s in servers:
            out = open(f"{log_dir}/sglang-{s.port}.log", "w") if log_dir else subprocess.DEVNULL
            procs.append((s, subprocess.Popen(s.command(python), stdout=out, stderr=subprocess.STDOUT)))
        urls = []
        for s, p in procs:
            url = f"http://127.0.0.1:{s.port}"
            wait_healthy(url, timeout, p)
            urls.append(url)
        yield urls
    finally:
        for _, p in procs:
            p.terminate()
        for _, p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
