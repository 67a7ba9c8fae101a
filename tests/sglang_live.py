"""Real SGLang 0.5.23 servers for the ``live_sglang`` tests, on tiny random Qwen2 models the
tests build and save.

The servers run from SGLang's own environment, named by ``RELAXTUNE_SGLANG_PYTHON`` (its
``bin/python``; ``scripts/sglang_env.sh`` builds one and ``.ci/run`` sets the variable).
Without the variable every live test skips, saying so. One drafter and one verifier
server are started once per test session (``live_pair``), through relaxtune's own
launcher (``relaxtune.backends.sglang_launch``: CPU engine, the ``sgl_kernel``
stand-in), and stopped at its end.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from relaxtune.backends.sglang_launch import ServerProcess, ServerSpec, launch, server_env, start_server, wait_healthy

from .tiny_models import save_tiny_model

PYTHON_VAR = "RELAXTUNE_SGLANG_PYTHON"
CONTEXT = 4096  # the CPU flags' --context-length: the saved configs say the same
START_TIMEOUT = float(os.environ.get("RELAXTUNE_SGLANG_START_TIMEOUT", "900"))


def sglang_python() -> str:
    """The python of SGLang's environment, or skip the test saying how to get one.

    Raises:
        pytest.fail: the variable names something that is not an executable file.
    """
    python = os.environ.get(PYTHON_VAR)
    if not python:
        pytest.skip(
            f"{PYTHON_VAR} is not set: build SGLang's environment with scripts/sglang_env.sh and set it "
            "to the python it prints"
        )
    if not os.access(python, os.X_OK):
        pytest.fail(f"{PYTHON_VAR}={python} is not an executable python")
    return python


def free_port() -> int:
    """A port nothing listens on now (the next one, port + 1, is checked by the launcher)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_live_model(path: Path, seed: int = 0, noise: float = 0.0) -> str:
    """``tiny_models.save_tiny_model`` with a context of ``CONTEXT`` tokens (SGLang refuses a
    ``--context-length`` above the config's)."""
    save_tiny_model(path, seed=seed, noise=noise)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    return str(path)


@dataclass
class LivePair:
    """Two running servers: their model folders, URLs and processes, and SGLang's python."""

    python: str
    drafter: str
    verifier: str
    log_dir: Path
    processes: list[ServerProcess] = field(default_factory=list)

    @property
    def urls(self) -> tuple[str, str]:
        return self.processes[0].url, self.processes[1].url

    def restart(self, i: int) -> ServerProcess:
        """Start server ``i`` again on its port (after it was stopped or killed) and wait for it."""
        old = self.processes[i]
        old.stop(grace=5)
        new = start_server(old.spec, self.python, "cpu", old.log, server_env("cpu", python=self.python))
        self.processes[i] = new
        wait_healthy(new.url, START_TIMEOUT, server=new)
        return new


def start_live_pair(root: Path):
    """A context manager yielding a ``LivePair`` on tiny models saved under ``root``."""
    import contextlib

    @contextlib.contextmanager
    def run():
        python = sglang_python()
        drafter = save_live_model(root / "drafter", noise=0.2)
        verifier = save_live_model(root / "verifier")
        pair = LivePair(python, drafter, verifier, root / "logs")
        port = free_port()
        specs = [ServerSpec(drafter, port), ServerSpec(verifier, port + 1)]
        with launch(
            specs,
            python=python,
            timeout=START_TIMEOUT,
            log_dir=str(pair.log_dir),
            device="cpu",
            processes=pair.processes,
        ):
            yield pair

    return run()
