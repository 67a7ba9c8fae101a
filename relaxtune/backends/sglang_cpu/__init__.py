"""What an SGLang server needs on a CPU host: the folder holding the pure-torch ``sgl_kernel``
stand-in (``KERNEL_DIR``, to put on the server's ``PYTHONPATH`` unless the CPU has Intel AMX
and SGLang's environment has a compiled CPU build of the kernels), the check for AMX and the
check for such a build (``docs/reference/sglang-cpu.md``)."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

__all__ = ["KERNEL_DIR", "cpu_has_amx", "has_cpu_kernel"]

KERNEL_DIR = Path(__file__).resolve().parent  # holds the package ``sgl_kernel``


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU has Intel AMX tiles (the ``amx_tile`` flag of ``/proc/cpuinfo``),
    where SGLang's real CPU kernels (a source build of ``sgl_kernel``) would run; False
    when the file cannot be read."""
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and "amx_tile" in line.partition(":")[2].split() for line in f)
    except (OSError, ValueError):  # unreadable, or not text
        return False


# what SGLang's cpu_has_amx_support() asks of the kernels, besides the CPU's AMX tiles; torch is
# imported (seconds) only when there is an sgl_kernel to look into. Only the printed mark says yes:
# an interpreter, or an sgl_kernel, that exits 0 before the op is looked up does not.
_MARK = "relaxtune: sgl_kernel has convert_weight_packed"
_PROBE = (
    "import importlib.util, sys\n"
    "if importlib.util.find_spec('sgl_kernel') is None: sys.exit(1)\n"
    "import torch, sgl_kernel; torch.ops.sgl_kernel.convert_weight_packed\n"
    f"print({_MARK!r})"
)


@functools.cache
def has_cpu_kernel(python: str, pythonpath: str | None = None, timeout: float = 300.0) -> bool:
    """Whether ``python`` (SGLang's environment, with ``pythonpath`` as its ``PYTHONPATH``)
    imports a compiled CPU build of ``sgl_kernel``: one that registers the op
    ``torch.ops.sgl_kernel.convert_weight_packed``, which SGLang's ``cpu_has_amx_support()``
    requires. False when it has none (PyPI has no CPU build; ``scripts/sglang_env.sh``
    installs none), when its ``sgl_kernel`` fails to import (the CUDA build without
    ``libcuda.so.1``) or lacks the op, or when the probe takes over ``timeout`` seconds.
    Asked once per interpreter and path in a process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (
        {"PYTHONPATH": pythonpath} if pythonpath else {}
    )
    try:  # no stdin: with PYTHONINSPECT set, a terminal would keep the probe at a >>> prompt
        found = subprocess.run(
            [python, "-c", _PROBE],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return found.returncode == 0 and _MARK.encode() in found.stdout.splitlines()
