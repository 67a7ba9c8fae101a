"""Backends: where drafter and verifier distributions come from.

``base`` defines the protocol; ``hf`` runs transformers models in-process.
Backends know nothing about tasks or methods.
"""

from .base import Backend, DraftResult, SequenceState

__all__ = ["Backend", "DraftResult", "SequenceState"]
