"""Whether llama.cpp's extra buffer types run on this CPU.

llama.cpp moves a model's quantized weights into extra buffer types when the CPU
has kernels for them: repacked layouts for AVX2/AVX-512, and Intel AMX tiles. A
CPU can advertise AMX that its machine will not run: on an Intel Xeon in a
Firecracker VM (2026-12-02), llama-cpp-python 0.3.36 built with
``GGML_NATIVE=ON`` died with a segmentation fault at its first AMX tile
configuration (``ldtilecfg`` in ``ggml_backend_amx_mul_mat``), on the first
decode of the embedded pair, with no message. Without the extra buffer types
(``llama_model_params.use_extra_bufts = False``) the same build decodes there.

So before a model loads with them, one decode of its first tokens runs in a
child process (``extra_buffers_run``). The verdict is kept per model content,
llama.cpp build and CPU in ``<relaxtune cache>/llamacpp-checks.json``, so it is
asked once per machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["extra_buffers_run"]

_MARK = "relaxtune: llama.cpp decoded"
_PROBE = f"""
import sys
import llama_cpp as L
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.n_gpu_layers = 0
model = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
cp = L.llama_context_default_params()
cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
ctx = L.llama_init_from_model(model, cp) if model else None
if ctx:
    n = min(32, L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)))
    tokens = (L.llama_token * n)(*range(n))  # kept: the batch points into it
    if L.llama_decode(ctx, L.llama_batch_get_one(tokens, n)) == 0:
        print({_MARK!r})
"""


def _identity(path: Path) -> str:
    """The model's content (size, first and last MiB), the llama.cpp build (its version
    and native libraries) and this CPU's flags, as one digest."""
    import llama_cpp

    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    h.update(f"{size}|{getattr(llama_cpp, '__version__', '?')}".encode())
    for lib in sorted(Path(llama_cpp.__file__).parent.rglob("*.so*")):
        h.update(f"|{lib.name}:{lib.stat().st_size}:{lib.stat().st_mtime_ns}".encode())
    try:
        with open("/proc/cpuinfo") as f:
            h.update(next((line for line in f if line.startswith("flags")), "").encode())
    except (OSError, ValueError):
        pass
    return h.hexdigest()[:32]


def extra_buffers_run(path: str | Path, python: str = sys.executable, timeout: float = 600.0) -> tuple[bool, str]:
    """Whether llama.cpp, loading the GGUF at ``path`` with its extra buffer types,
    decodes on this CPU: one decode of the model's first 32 token ids in a child
    process (``python``), asked once per model content, llama.cpp build and CPU.

    Returns:
        ``(runs, why)``: False with why in words when the child died by a signal or
        took over ``timeout`` seconds (a timeout is not kept: it may be the machine's
        load); True when it decoded, or failed without crashing (a file llama.cpp
        cannot load: the load in this process says so by name; not kept).
    """
    path = Path(path)
    checks = _checks_file()
    key = _identity(path)
    try:
        known = json.loads(checks.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), list):
        return tuple(known[key])
    try:
        done = subprocess.run(
            [python, "-c", _PROBE, str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"its probe decode took over {timeout:g} s"
    if done.returncode >= 0 and _MARK.encode() not in done.stdout:
        return True, "its probe did not decode (no crash; not kept)"
    verdict = (
        (True, "decoded") if done.returncode >= 0 else (False, f"its probe decode died by signal {-done.returncode}")
    )
    known[key] = list(verdict)
    try:
        checks.parent.mkdir(parents=True, exist_ok=True)
        tmp = checks.with_name(f"{checks.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(checks)  # atomic: workers probing at once keep one whole file
    except OSError:
        pass  # not kept: asked again next time
    return verdict


def _checks_file() -> Path:
    from .embedded import cache_dir

    return cache_dir() / "llamacpp-checks.json"
