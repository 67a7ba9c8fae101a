"""The one place relaxtune calls transformers' private functions (contract test:
``tests/test_transformers_compat.py``).

``speculative_sampling`` wraps ``transformers.generation.utils._speculative_sampling``
(transformers 5.14.0+ with ``assistant_ensemble_weight``; checked on 5.24.0, where
it is ``generation/utils.py`` :4444-4507): the verification step of transformers'
assisted generation on the sampling path (``do_sample=True``), for one sequence.
With ``assistant_ensemble_weight = w`` it is the static ensemble that relaxtune's
``ens`` runs at ``alpha = 1 - w`` (``relaxtune.decoding.engine_rules.ensemble_weight``);
the statistical agreement is ``tests/test_transformers_compat.py``, so a transformers
upgrade that changes the rule fails there.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
import transformers
from transformers.generation import utils as _generation_utils

__all__ = [
    "TRANSFORMERS_VERSION",
    "SPECULATIVE_SAMPLING_PARAMS",
    "speculative_sampling",
    "record_assisted_rounds",
    "pinned_generation_config",
]

TRANSFORMERS_VERSION = transformers.__version__
SPECULATIVE_SAMPLING_PARAMS = (
    "candidate_input_ids",
    "candidate_logits",
    "candidate_length",
    "new_logits",
    "assistant_ensemble_weight",
)


def _private():
    """transformers' ``_speculative_sampling``, checked against the signature relaxtune calls.

    Raises:
        RuntimeError: the function is missing or its parameters changed (naming the
            installed transformers version).
    """
    fn = getattr(_generation_utils, "_speculative_sampling", None)
    if fn is None:
        raise RuntimeError(f"transformers {TRANSFORMERS_VERSION} has no generation.utils._speculative_sampling")
    params = tuple(inspect.signature(fn).parameters)
    if params != SPECULATIVE_SAMPLING_PARAMS:
        raise RuntimeError(
            f"transformers {TRANSFORMERS_VERSION}: _speculative_sampling takes {params}, "
            f"relaxtune was written for {SPECULATIVE_SAMPLING_PARAMS}"
        )
    return fn


def speculative_sampling(
    draft_ids: torch.Tensor,
    drafter_logits: torch.Tensor,
    verifier_logits: torch.Tensor,
    ensemble_weight: float | None = None,
) -> tuple[list[int], int]:
    """One verification round of transformers' assisted generation (sampling path).

    Args:
        draft_ids: ``[K]`` drafted token ids.
        drafter_logits: ``[K, V]`` the assistant's processed scores at the drafted
            positions (transformers takes their softmax as q).
        verifier_logits: ``[K+1, V]`` the model's processed scores (softmax: p).
        ensemble_weight: transformers' ``assistant_ensemble_weight`` w in (0, 1);
            None for lossless speculative sampling.

    Returns:
        ``(tokens, accepted)``: the emitted ids (accepted drafts, then the
        residual or bonus token) and the number of accepted drafts. Random numbers
        come from torch's global generator (``torch.rand_like``, ``torch.multinomial``).

    Raises:
        ValueError: shapes that do not fit; RuntimeError as ``_private``.
    """
    k = int(draft_ids.shape[0])
    if draft_ids.dim() != 1 or tuple(drafter_logits.shape[:1]) != (k,) or verifier_logits.shape[0] != k + 1:
        raise ValueError(
            f"need draft_ids [K], drafter_logits [K, V], verifier_logits [K+1, V]; got {tuple(draft_ids.shape)}, "
            f"{tuple(drafter_logits.shape)}, {tuple(verifier_logits.shape)}"
        )
    tokens, n = _private()(
        draft_ids.long().unsqueeze(0), drafter_logits.unsqueeze(0), k, verifier_logits.unsqueeze(0), ensemble_weight
    )
    return tokens[0].tolist(), int(n)


@contextlib.contextmanager
def record_assisted_rounds():
    """Record every round of transformers' assisted generation inside the block.

    Wraps the public hook ``AssistedCandidateGenerator.update_candidate_strategy``
    (transformers 5.24.0 ``generation/candidate_generator.py`` :223, called once per
    round from ``generation/utils.py`` ``_assisted_decoding`` :4185 with the verifier's
    ``[1, candidate_length + 1, V]`` scores and the accepted drafts after the EOS and
    length crops), then calls the original, so generation is unchanged.

    Yields:
        a list that fills with ``(candidate_length, accepted)`` per round, in order.

    Raises:
        RuntimeError: the hook is missing (naming the installed transformers version).
    """
    from transformers.generation import AssistedCandidateGenerator

    original = getattr(AssistedCandidateGenerator, "update_candidate_strategy", None)
    if original is None:
        raise RuntimeError(
            f"transformers {TRANSFORMERS_VERSION} has no AssistedCandidateGenerator.update_candidate_strategy"
        )
    rounds: list[tuple[int, int]] = []

    def hook(self, input_ids, scores, num_matches):
        rounds.append((int(scores.shape[1]) - 1, int(num_matches)))
        return original(self, input_ids, scores, num_matches)

    AssistedCandidateGenerator.update_candidate_strategy = hook
    try:
        yield rounds
    finally:
        AssistedCandidateGenerator.update_candidate_strategy = original


@contextlib.contextmanager
def pinned_generation_config(model, fields: dict):
    """Set ``fields`` on ``model.generation_config`` inside the block, and restore them after.

    For settings ``generate()`` reads from a model's own generation config rather than
    from its keywords: an assistant's draft length and confidence threshold
    (transformers 5.24.0 ``AssistedCandidateGenerator.__init__`` reads
    ``assistant_model.generation_config``) and its ``eos_token_id`` (the assistant's
    ``generate`` fills unset fields from it, so a verifier run without EOS still drafts
    with one).
    """
    config = model.generation_config
    saved = {k: getattr(config, k, None) for k in fields}
    try:
        for k, v in fields.items():
            setattr(config, k, v)
        yield config
    finally:
        for k, v in saved.items():
            setattr(config, k, v)
