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

A drafter may propose point masses instead of samples (prompt lookup,
``relaxtune.backends.lookup``): such a backend sets ``point_mass_drafts = True``
and returns drafter rows that are ``0`` at the drafted id and ``-inf`` elsewhere;
the engine then takes ``q`` as one-hot at the id ``pick`` returns (its argmax),
without running the sampling transform on the row. The attribute is optional:
absent means False, so other backends need not change.

A backend that can advance many sequences at once also implements
``BatchBackend``: a ``Batch`` of rows (one ``SequenceState`` each) that join and
leave at any round (continuous refill), one forward per drafting step, one
scoring pass and one commit for all rows, with ragged acceptance. Backends
without it (the SGLang client) run one sequence per thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

__all__ = ["Backend", "BatchBackend", "Batch", "DraftResult", "SequenceState", "Pick", "BatchPick", "is_batched",
           "point_mass_drafts"]

Pick = Callable[[torch.Tensor], int]
BatchPick = Callable[[torch.Tensor, int], torch.Tensor]  # (raw drafter logits [R, V], draft step) -> ids [R]


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
        prefill_seconds: wall seconds of the prompt's prefill forwards when they
            run apart from the rounds (batched path); 0 when the first round's
            forwards include the prompt.
        extra: backend-specific state (caches, what each cache holds).

    In a batch, a forward's seconds are shared equally among the rows it served,
    so the rows' seconds add up to the batch's.
    """

    tokens: list[int]
    prompt_len: int
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    draft_forwards: int = 0
    verify_forwards: int = 0
    draft_tokens_fed: int = 0
    verify_tokens_fed: int = 0
    prefill_seconds: float = 0.0
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
        point_mass_drafts: optional, default False: the drafter's rows are point
            masses (see the module doc).
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


@dataclass
class Batch:
    """The sequences a ``BatchBackend`` advances together.

    Attributes:
        states: one ``SequenceState`` per row, in row order (rows are renumbered
            when some leave).
        extra: backend-specific state (the batched caches).
    """

    states: list[SequenceState] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        """R, the sequences in the batch."""
        return len(self.states)


class BatchBackend(Backend, Protocol):
    """A ``Backend`` that also advances R sequences at once (one forward per step
    for all of them). Row r of every tensor is ``batch.states[r]``.

    Attributes:
        batch_size: the most rows a batch should hold (the evaluation's default).
    """

    batch_size: int

    def start_batch(self) -> Batch:
        """An empty batch."""
        ...

    def join(self, batch: Batch, prompts: Sequence[Sequence[int]]) -> list[SequenceState]:
        """Append one row per prompt (prefilling the prompt) and return their states."""
        ...

    def leave(self, batch: Batch, rows: Sequence[int]) -> None:
        """Remove ``rows`` (indices) from the batch; later rows move up."""
        ...

    def draft_batch(self, batch: Batch, n: int, pick: BatchPick, extra_step: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``n`` tokens for every row, one drafter forward per step, calling
        ``pick(logits [R, V], step) -> ids [R]``. Returns the drafted ids ``[R, n]``
        and the raw drafter logits ``[R, n, V]`` (``[R, n+1, V]`` with ``extra_step``)."""
        ...

    def score_batch(self, batch: Batch, draft_ids: torch.Tensor) -> torch.Tensor:
        """Verifier raw logits ``[R, N+1, V]`` over each row's tokens plus its drafts
        ``draft_ids [R, N]`` in one pass (``N = 0``: the next-token rows, AR)."""
        ...

    def commit_batch(self, batch: Batch, tokens: Sequence[Sequence[int]]) -> None:
        """Append each row's emitted tokens and roll its caches back to what they
        share with its new sequence."""
        ...


def is_batched(backend) -> bool:
    """True when ``backend`` implements ``BatchBackend`` (and allows batching)."""
    return callable(getattr(backend, "start_batch", None)) and int(getattr(backend, "batch_size", 0) or 0) >= 1


def point_mass_drafts(backend) -> bool:
    """True when ``backend``'s drafter proposes point masses (``point_mass_drafts``)."""
    return bool(getattr(backend, "point_mass_drafts", False))
