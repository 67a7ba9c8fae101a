"""What a GGUF file's weights are, read from the file's own metadata: its quantisation type
(``general.file_type``, llama.cpp's ``enum llama_ftype``, e.g. 15 = ``Q4_K_M``), for the
tuned config to name what a llama.cpp run measured (``relaxtune.report.deploy.weights``).

Read with llama-cpp-python's public bindings of ``llama.h`` (``llama_model_load_from_file``
with ``vocab_only``, ``llama_model_meta_val_str``): about a second, where ``gguf.GGUFReader``
parses every field of the file (a 151,936-token vocabulary: tens of seconds on a busy
2-core CPU). The number is named with the ``gguf`` package's ``LlamaFileType`` (the same
enum, Python side). A file without ``general.file_type`` (the tests' tiny GGUFs) is named by
its tensors' most common type, read with ``gguf.GGUFReader``.
"""

from __future__ import annotations

import ctypes
import functools
from collections import Counter
from pathlib import Path

__all__ = ["gguf_quant_type", "embedded_gguf"]


def embedded_gguf(model: str) -> Path | None:
    """The assembled GGUF file of an embedded model (``relaxtune.backends.embedded``) when it is
    on disk, else None; a ``.gguf`` path that exists, as itself; None for anything else."""
    from .embedded import EMBEDDED, cache_dir

    path = cache_dir() / model / "model.gguf" if model in EMBEDDED else Path(model).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


@functools.lru_cache(maxsize=16)
def gguf_quant_type(path: str) -> str:
    """The quantisation type of the GGUF file at ``path``: ``"Q4_K_M"``, ``"F16"``, ``"F32"`` ...
    (``general.file_type`` named by ``gguf.LlamaFileType`` less its ``MOSTLY_``/``ALL_`` prefix;
    a number llama.cpp added after this ``gguf`` release as ``"file_type <n>"``); without that
    key, the most common tensor type (``gguf.GGMLQuantizationType``'s name).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: llama.cpp cannot read it as a GGUF model.
        relaxtune.backends.llamacpp_model.LlamaCppMissing: llama-cpp-python is not installed.
    """
    import gguf

    from .llamacpp_model import require_llama_cpp

    if not Path(path).is_file():
        raise FileNotFoundError(f"no GGUF file {path}")
    L = require_llama_cpp()
    params = L.llama_model_default_params()
    params.vocab_only = True  # the metadata and vocabulary, no tensors
    model = L.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ValueError(f"llama.cpp cannot read {path} as a GGUF model")
    try:
        buf = ctypes.create_string_buffer(64)
        found = L.llama_model_meta_val_str(model, b"general.file_type", buf, len(buf)) >= 0
    finally:
        L.llama_model_free(model)
    if found:
        value = int(buf.value)
        try:
            return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return f"file_type {value}"
    counts = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors)
    return counts.most_common(1)[0][0] if counts else "unknown (no tensors)"
