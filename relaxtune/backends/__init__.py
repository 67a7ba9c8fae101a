"""Backends: where drafter and verifier distributions come from.

``base`` defines the protocol; ``hf`` runs transformers models in-process (``hf_batch``
its batched forwards over ``ragged`` caches); ``llamacpp`` runs GGUF files on llama.cpp
(``llamacpp_model`` one model's context); ``http``, ``sglang`` and ``sglang_native``
talk to SGLang servers (``sglang_launch`` starts them, on a CPU host with the
pure-torch ``sgl_kernel`` stand-in of ``sglang_cpu``; ``sglang_models`` checks the
model each serves); ``lookup`` drafts by prompt lookup without a model; ``embedded``
assembles the embedded CPU pair. Backends know nothing about tasks or methods.

May import: decoding.
"""

from .base import Backend, DraftResult, SequenceState

__all__ = ["Backend", "DraftResult", "SequenceState"]
