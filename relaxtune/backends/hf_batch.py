"""The batch protocol of the in-process backend (``relaxtune.backends.base.Backend`` on ``HFBackend``).

Every row of a ``Batch`` shares one ``RaggedCache`` per model: a drafting step,
a scoring pass or an AR step is one forward for all rows, each row is charged
an equal share of its seconds, and after a round each cache keeps, row by row,
the prefix it shares with the row's sequence (the rule of ``HFBackend.commit``).
Models with sliding-window layers cannot share a ragged cache: their batches run
row by row on ``HFBackend``'s one-sequence caches (``relaxtune.backends.rows``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from .base import Batch, BatchPick, SequenceState
from .ragged import RaggedCache
from .rows import RowByRow

__all__ = ["BatchedForwards", "common_prefix"]


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, known equal before ``start``."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


class BatchedForwards(RowByRow):
    """The batch methods for a backend with ``drafter``, ``verifier``,
    ``device``, ``name``, ``ragged`` (False: the models cannot share a ragged cache,
    and batches run row by row) and
    ``prefill_stores`` (a ``PrefillStore`` per model, "v" and "d", kept across
    batches: the next evaluation of the same prompts skips their prefill)."""

    def start_batch(self) -> Batch:
        """An empty batch with one ragged cache per model (row by row when the
        models cannot share one)."""
        batch = Batch()
        if not self.ragged:
            batch.extra["rows"] = True
            return batch
        batch.extra["v"] = RaggedCache(self.verifier, self.device, self.prefill_stores["v"])
        if self.drafter is not None:
            batch.extra["d"] = RaggedCache(self.drafter, self.device, self.prefill_stores["d"])
        return batch

    @staticmethod
    def _caches(batch: Batch) -> list[tuple[str, RaggedCache]]:
        return [(k, batch.extra[k]) for k in ("v", "d") if k in batch.extra]

    def join(self, batch: Batch, prompts: Sequence[Sequence[int]]) -> list[SequenceState]:
        """Append one row per prompt: each model prefills all of it but the last
        token in a forward of its own (``prefill_seconds``).

        Raises:
            ValueError: an empty prompt (nothing joins).
        """
        if batch.extra.get("rows"):
            return super().join(batch, prompts)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt must hold at least one token")
        states = [SequenceState(tokens=[int(t) for t in p], prompt_len=len(p)) for p in prompts]
        joined: list[RaggedCache] = []
        try:
            for key, cache in self._caches(batch):
                seconds = cache.join([s.tokens[:-1] for s in states])
                joined.append(cache)
                for s, t in zip(states, seconds):
                    s.prefill_seconds += t
                    if key == "v":
                        s.verify_tokens_fed += len(s.tokens) - 1
                    else:
                        s.draft_tokens_fed += len(s.tokens) - 1
        except BaseException:
            for cache in joined:  # all caches keep the same rows
                cache.leave(list(range(batch.rows, cache.rows)))
            raise
        batch.states.extend(states)
        return states

    def leave(self, batch: Batch, rows: Sequence[int]) -> None:
        """Remove ``rows`` from the batch (their caches' rows with them)."""
        if batch.extra.get("rows"):
            return super().leave(batch, rows)
        for _, cache in self._caches(batch):
            cache.leave(list(rows))
        gone = set(rows)
        batch.states = [s for i, s in enumerate(batch.states) if i not in gone]

    def _batch_forward(self, batch: Batch, key: str, feeds: list[list[int]], keep: int) -> torch.Tensor:
        """One forward of the ``key`` model ("v" or "d") for every row; each row is
        charged its share of the seconds."""
        t0 = time.perf_counter()
        logits = batch.extra[key].forward(feeds, keep)
        share = (time.perf_counter() - t0) / len(feeds)
        for state, feed in zip(batch.states, feeds):
            if key == "v":
                state.verify_seconds += share
                state.verify_forwards += 1
                state.verify_tokens_fed += len(feed)
            else:
                state.draft_seconds += share
                state.draft_forwards += 1
                state.draft_tokens_fed += len(feed)
        return logits

    def _lacking(self, batch: Batch, key: str) -> list[list[int]]:
        """Per row, the committed tokens the ``key`` cache lacks (at least one)."""
        return [s.tokens[len(fed) :] for s, fed in zip(batch.states, batch.extra[key].fed)]

    def draft_batch(
        self, batch: Batch, n: int, pick: BatchPick, extra_step: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``n`` tokens for every row, one drafter forward per step (the first
        feeds the one or two committed tokens each row's cache lacks, left-padded).
        Returns ids ``[R, n]`` and raw logits ``[R, n(+1), V]`` (float32)."""
        if batch.extra.get("rows"):
            return super().draft_batch(batch, n, pick, extra_step)
        if self.drafter is None:
            raise RuntimeError("this backend has no drafter (AR only)")
        feeds = self._lacking(batch, "d")
        ids: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        for i in range(n + int(extra_step)):
            rows.append(self._batch_forward(batch, "d", feeds, 1)[:, 0])
            if i < n:
                ids.append(pick(rows[-1], i).long())
                feeds = [[t] for t in ids[-1].tolist()]
        return torch.stack(ids, 1), torch.stack(rows, 1)

    def score_batch(self, batch: Batch, draft_ids: torch.Tensor) -> torch.Tensor:
        """Verifier raw logits ``[R, N+1, V]`` (float32) over each row's lacking
        token and its drafts ``draft_ids [R, N]`` (N may be 0: an AR step)."""
        if batch.extra.get("rows"):
            return super().score_batch(batch, draft_ids)
        feeds = [lack + d for lack, d in zip(self._lacking(batch, "v"), draft_ids.tolist())]
        return self._batch_forward(batch, "v", feeds, draft_ids.shape[1] + 1)

    def commit_batch(self, batch: Batch, tokens: Sequence[Sequence[int]]) -> None:
        """Append each row's tokens; each cache keeps, per row, the prefix it shares
        with the row's sequence (leaving its last token uncached)."""
        if batch.extra.get("rows"):
            return super().commit_batch(batch, tokens)
        for r, (state, new) in enumerate(zip(batch.states, tokens)):
            before = len(state.tokens)
            state.tokens.extend(int(t) for t in new)
            for _, cache in self._caches(batch):
                cache.rollback(r, min(common_prefix(cache.fed[r], state.tokens, before), len(state.tokens) - 1))
        for _, cache in self._caches(batch):
            cache.tidy()
