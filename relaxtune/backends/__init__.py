"""Backends: where drafter and verifier distributions come from.

``base`` defines the one protocol (a batch of sequences; one sequence is a batch of
one); ``rows`` builds it row by row from one-sequence helpers (the SGLang client, its
rows' requests in flight together); ``hf`` runs transformers models in-process
(``hf_batch`` its batched forwards over ``ragged`` caches); ``llamacpp`` runs GGUF files
on llama.cpp (``llamacpp_model`` one model's context); ``http``, ``sglang`` and
``sglang_native`` talk to SGLang servers (``sglang_costs`` times them at serving batch
sizes; ``sglang_launch`` starts them, on a CPU host with the pure-torch ``sgl_kernel``
stand-in of ``sglang_cpu``; ``sglang_models`` checks the model each serves); ``lookup``
drafts by prompt lookup without a model; ``embedded`` assembles the embedded CPU pair
(through ``scratch``: no temporary file outlives an interrupt); ``naming`` names every
pair; ``costs`` measures and keeps the cost profile; ``load`` picks the backend.
Backends know nothing about tasks or methods.

May import: decoding.
"""

from .base import Backend, Batch, SequenceState

__all__ = ["Backend", "Batch", "SequenceState"]
