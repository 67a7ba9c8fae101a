"""The batch protocol built from one-sequence helpers, row by row.

``RowByRow`` implements ``relaxtune.backends.base.Backend``'s batch methods for a
backend that serves one sequence at a time through four helpers:

    start(prompt_ids)               -> a fresh ``SequenceState``
    draft(state, n, pick, extra)    -> ``DraftResult`` (``pick(row [V]) -> id``)
    score(state, draft_ids)         -> verifier raw logits ``[N+1, V]``
    commit(state, tokens)           -> append the tokens

A round calls the helpers once per row. With ``concurrent_rows`` True (the SGLang
client: a row is HTTP requests) the rows' calls run in a thread pool of
``batch_size`` threads, so R rows keep R requests in flight; else one after the
other (an in-process model that cannot batch its caches). A row's result does not
depend on the others: ``pick`` is called with the row's index, so each row draws
its own random numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from .base import Batch, BatchPick, SequenceState

__all__ = ["RowByRow"]


class RowByRow:
    """Batch methods over the one-sequence helpers ``start``, ``draft``, ``score``
    and ``commit`` (see the module doc). The class sets ``batch_size``;
    ``concurrent_rows`` (default False) runs the rows' calls in threads."""

    concurrent_rows = False

    def _each(self, fn: Callable, items: Sequence) -> list:
        """``fn`` over ``items``, in threads when ``concurrent_rows`` (results in order)."""
        if not self.concurrent_rows or len(items) <= 1:
            return [fn(x) for x in items]
        pool = ThreadPoolExecutor(max(1, min(len(items), int(self.batch_size))))
        try:
            return list(pool.map(fn, items))
        finally:
            pool.shutdown(wait=True)

    def start_batch(self) -> Batch:
        """An empty batch (no shared state: each row is its own sequence)."""
        return Batch()

    def join(self, batch: Batch, prompts: Sequence[Sequence[int]]) -> list[SequenceState]:
        """One fresh state per prompt (``start``; its first forward prefills it).

        Raises:
            ValueError: an empty prompt (from ``start``)."""
        states = [self.start(p) for p in prompts]
        batch.states.extend(states)
        return states

    def leave(self, batch: Batch, rows: Sequence[int]) -> None:
        """Drop ``rows`` (indices); later rows move up."""
        gone = set(rows)
        batch.states[:] = [s for i, s in enumerate(batch.states) if i not in gone]

    def draft_batch(
        self, batch: Batch, n: int, pick: BatchPick, extra_step: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``draft`` per row; the row's sampler is ``pick(row [1, V], step, [r])``.
        Returns ids ``[R, n]`` and raw drafter logits ``[R, n(+1), V]``."""

        def one(r: int):
            steps = iter(range(n))
            return self.draft(
                batch.states[r], n, lambda z: int(pick(z[None], next(steps), [r])[0]), extra_step=extra_step
            )

        out = self._each(one, range(batch.rows))
        return torch.tensor([d.ids for d in out], dtype=torch.long).reshape(batch.rows, n), torch.stack(
            [d.logits for d in out]
        )

    def score_batch(self, batch: Batch, draft_ids: torch.Tensor) -> torch.Tensor:
        """``score`` per row: verifier raw logits ``[R, N+1, V]``."""
        ids = draft_ids.tolist()
        return torch.stack(self._each(lambda r: self.score(batch.states[r], ids[r]), range(batch.rows)))

    def commit_batch(self, batch: Batch, tokens: Sequence[Sequence[int]]) -> None:
        """``commit`` per row."""
        for state, kept in zip(batch.states, tokens):
            self.commit(state, kept)
