"""relaxtune: per-task tuning of relaxed speculative decoding.

The decoding core: ``relaxtune.decoding.methods`` (the relaxed rules and their registry),
``relaxtune.decoding.sampling`` (the sampling transform), ``relaxtune.decoding`` (one
verification round) and ``relaxtune.decoding.speed`` (the speed model). Around it:
``engine`` and ``backends`` (whole responses in-process or over SGLang),
``tasks``, ``graders`` and ``evaluation`` (capability), ``tuning``,
``tracking``, ``export`` and ``job`` (the main job), ``cli`` (the command line).
"""

from .decoding.methods import METHODS, MethodSpec, get_method
from .decoding.round import BatchRoundResult, RoundResult, verify_round, verify_rounds
from .decoding.sampling import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "MethodSpec",
    "get_method",
    "SamplingParams",
    "verify_round",
    "verify_rounds",
    "RoundResult",
    "BatchRoundResult",
]
