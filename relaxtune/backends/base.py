"""The backend protocol: drafting, one-pass verification, and committing tokens.

A backend serves one drafter/verifier pair. Per sequence it keeps a
``SequenceState`` (committed tokens, caches, timings). One speculative round is

    draft(state, N, pick)  -> N drafted ids and the drafter's raw logits [N(+1), V]
    score(state, drafts)   -> the verifier's raw logits [N+1, V] in ONE pass
    commit(state, tokens)  -> append the emitted tokens; caches roll back to the
                              longest prefix they still share with the sequence

and an autoregressive step is ``step(state)`` (verifier logits ``[V]``) then
``commit``. ``pick`` is the caller's sampler: it maps a raw drafter logit row
``[V]`` to the drafted token id, so sampling (and its randomness) stays with the
caller and the backend never sees a method or a task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

__all__ = ["Backend", "DraftResult", "SequenceState", "Pick"]

Pick = Callable[[torch.Tensor], int]


@dataclass
class SequenceState:
    """Per-sequence state a backend keeps between calls.

    Attributes:
        tokens: prompt + committed generated token ids.
        prompt_len: number of prompt tokens.
        draft_seconds: wall seconds spent in drafter forward passes.
        verify_seconds: wall seconds spent in verifier forward passes.
        draft_forwards / verify_forwards: forward-pass counts.
        draft_tokens_fed / verify_tokens_fed: query tokens fed to each model
            (prefill included).
        extra: backend-specific state (caches, what each cache holds).
    """

    tokens: list[int]
    prompt_len: int
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    draft_forwards: int = 0
    verify_forwards: int = 0
    draft_tokens_fed: int = 0
    verify_tokens_fed: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def generated(self) -> list[int]:
        """The committed generated ids (tokens after the prompt)."""
        return self.tokens[self.prompt_len :]


@dataclass(frozen=True)
class DraftResult:
    """What ``Backend.draft`` returns.

    Attributes:
        ids: the N drafted token ids.
        logits: raw drafter logits ``[N, V]`` at the drafted positions, or
            ``[N+1, V]`` with the row after the last draft when ``extra_step``.
    """

    ids: list[int]
    logits: torch.Tensor


class Backend(Protocol):
    """A drafter/verifier pair serving next-token logits.

    Attributes:
        vocab_size: V, the width of every logit row (tokens).
        eos_token_ids: ids that end a response.
        name: a short description (model ids) for records.
    """

    vocab_size: int
    eos_token_ids: frozenset[int]
    name: str

    def start(self, prompt_ids: Sequence[int]) -> SequenceState:
        """A fresh state for a prompt (no forward pass yet)."""
        ...

    def draft(self, state: SequenceState, n: int, pick: Pick, extra_step: bool = False) -> DraftResult:
        """Draft ``n`` tokens with the drafter, calling ``pick(logits [V]) -> id``
        at each position; with ``extra_step`` also return the drafter row after the
        last draft (one more drafter forward, reusing the cache)."""
        ...

    def score(self, state: SequenceState, draft_ids: Sequence[int]) -> torch.Tensor:
        """Verifier raw logits ``[N+1, V]`` over ``tokens + draft_ids`` in one pass:
        row i is the next-token distribution before draft i, row N the bonus row."""
        ...

    def step(self, state: SequenceState) -> torch.Tensor:
        """Verifier raw logits ``[V]`` for the next token (autoregressive step)."""
        ...

    def commit(self, state: SequenceState, tokens: Sequence[int]) -> None:
        """Append emitted ``tokens`` and roll the caches back to what they share
        with the new sequence."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids to text."""
        ...
