"""What an SGLang server needs on a CPU host: the folder holding the pure-torch ``sgl_kernel``
stand-in (``KERNEL_DIR``, to put on the server's ``PYTHONPATH`` where the CPU has no Intel
AMX) and the check for AMX (``shared/docs/sglang-cpu.md``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["KERNEL_DIR", "cpu_has_amx"]

KERNEL_DIR = Path(__file__).resolve().parent  # holds the package ``sgl_kernel``


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU has Intel AMX tiles (the ``amx_tile`` flag of ``/proc/cpuinfo``),
    where SGLang's real CPU kernels (a source build of ``sgl_kernel``) would run; False
    when the file cannot be read."""
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return False
