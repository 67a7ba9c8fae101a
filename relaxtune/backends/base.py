"""The backend protocol: one, over a batch of sequences (one sequence is a batch of one).

A backend serves one drafter/verifier pair. It advances a ``Batch`` of rows, one
``SequenceState`` each (committed tokens, caches, timings), that join and leave at
any round (continuous refill). One speculative round for every row is

    draft_batch(batch, N, pick) -> drafted ids [R, N] and the drafter's raw logits [R, N(+1), V]
    score_batch(batch, drafts)  -> the verifier's raw logits [R, N+1, V] in ONE pass
    commit_batch(batch, tokens) -> append each row's emitted tokens; caches roll back
                                   to the longest prefix they still share with the row

and an autoregressive step is ``score_batch`` with ``N = 0`` then ``commit_batch``.
``pick`` is the caller's sampler: it maps the raw drafter logit rows ``[R, V]`` of a
drafting step to the drafted ids ``[R]``, so sampling (and its randomness) stays
with the caller and the backend never sees a method or a task. ``pick`` works row
by row, so a backend may call it on the rows of one step in any grouping.

Who implements it: the in-process models (``hf``: one forward per drafting step for
all rows; ``llamacpp``: one ``llama_decode`` per step), prompt lookup (``lookup``,
over any of them), and the SGLang client (``sglang_batch``: one HTTP request per row
and step, the rows' requests in flight together). The native SGLang speculative
server runs whole responses itself: a backend that has one names it in ``native``
(None everywhere else) and ``native_server`` is the one place that asks.

A drafter may propose point masses instead of samples (prompt lookup): such a
backend sets ``point_mass_drafts = True`` and returns drafter rows that are ``0`` at
the drafted id and ``-inf`` elsewhere; the engine then takes ``q`` as one-hot at the
id ``pick`` returns (its argmax), without running the sampling transform on the row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

__all__ = ["Backend", "Batch", "DraftResult", "SequenceState", "Pick", "BatchPick", "native_server"]

Pick = Callable[[torch.Tensor], int]  # one row's sampler, for backends built from one-sequence helpers
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
    """One row's drafts, for backends whose batch methods are built from one-sequence
    helpers (``hf``, ``llamacpp``, ``lookup``).

    Attributes:
        ids: the N drafted token ids.
        logits: raw drafter logits ``[N, V]`` at the drafted positions, or
            ``[N+1, V]`` with the row after the last draft when ``extra_step``.
    """

    ids: list[int]
    logits: torch.Tensor


@dataclass
class Batch:
    """The sequences a backend advances together.

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


class Backend(Protocol):
    """A drafter/verifier pair advancing R sequences at once. Row r of every tensor
    is ``batch.states[r]``.

    Attributes:
        vocab_size: V, the width of every logit row (tokens).
        eos_token_ids: ids that end a response.
        name: a short description (model ids) for records.
        batch_size: the most rows a batch should hold (the evaluation's default;
            requests in flight for a server).
        point_mass_drafts: the drafter's rows are point masses (see the module doc).
        native: the SGLang speculative server that runs ``sglang_threshold`` itself
            (``relaxtune.backends.sglang_native.NativeSpecServer``), or None.
    """

    vocab_size: int
    eos_token_ids: frozenset[int]
    name: str
    batch_size: int
    point_mass_drafts: bool
    native: object | None

    def start_batch(self) -> Batch:
        """An empty batch."""
        ...

    def join(self, batch: Batch, prompts: Sequence[Sequence[int]]) -> list[SequenceState]:
        """Append one row per prompt (prefilling the prompt) and return their states.

        Raises:
            ValueError: an empty prompt."""
        ...

    def leave(self, batch: Batch, rows: Sequence[int]) -> None:
        """Remove ``rows`` (indices) from the batch; later rows move up."""
        ...

    def draft_batch(
        self, batch: Batch, n: int, pick: BatchPick, extra_step: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``n`` tokens for every row, calling ``pick(logits [R, V], step) -> ids [R]``
        once per step. Returns the drafted ids ``[R, n]`` and the raw drafter logits
        ``[R, n, V]`` (``[R, n+1, V]`` with ``extra_step``: the row after the last draft)."""
        ...

    def score_batch(self, batch: Batch, draft_ids: torch.Tensor) -> torch.Tensor:
        """Verifier raw logits ``[R, N+1, V]`` over each row's tokens plus its drafts
        ``draft_ids [R, N]`` in one pass (``N = 0``: the next-token rows, AR): row i
        is the next-token distribution before draft i, row N the bonus row."""
        ...

    def commit_batch(self, batch: Batch, tokens: Sequence[Sequence[int]]) -> None:
        """Append each row's emitted tokens and roll its caches back to what they
        share with its new sequence."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids to text."""
        ...


def native_server(backend, method: str):
    """The backend's SGLang speculative server when ``method`` is one that server
    runs itself (``MethodSpec.server_native``), else None: the one place that asks
    whether a method's point is pinned by a server's launch flags."""
    from ..decoding.methods import get_method

    server = getattr(backend, "native", None)
    return server if server is not None and method != "ar" and get_method(method).server_native else None
