"""A simulated drafter/verifier pair for the serving benchmark (``relaxtune.bench.serving``):
a real ``Backend`` whose forwards cost virtual seconds from a roofline cost model, so
relaxtune's own batched decode loop runs on it and its throughput is read off a clock
that no other work on the machine can disturb.

Costs: one batched forward of ``model`` over R rows of k tokens each costs
``fixed * max(1, R k / capacity)`` virtual seconds (``Roofline``): a fixed, memory-bound
cost up to ``capacity`` tokens per forward, then compute bound, growing with the tokens.
A GPU serving engine behaves so (the verifier's N + 1 tokens are nearly free at small
serving batch sizes, close to N + 1 steps at large ones; SGLang's AutoSpec, NVIDIA
SPEED-Bench). ``cost_profile`` returns exactly these costs as a ``ServingProfile``,
the signature the in-process backends measure theirs with.

Logits: every position has the same raw rows, the verifier's ``z_p`` and the drafter's
``z_q = z_p + noise`` (``[V]``, seeded), so strict accepts each draft independently with
probability ``sum min(p, q)`` of the transformed rows, and a relaxed rule more.

``SimServingPair.crossing_at(B)``: the verifier's capacity is B tokens, so at every
serving batch size >= B batched AR is compute bound and a verify pass over N + 1 tokens
costs N + 1 AR steps: no point pays, whatever its acceptance ((l + 1) t_AR <
N t_draft + (N + 1) t_AR for l <= N). Below B the fixed costs make speculation pay
(strict pays at B / 2 when ``l_accept > N c + (N + 1) / 2 - 1``, c the drafter's fixed
cost over the verifier's). So the batch size from which speculation stops paying
(``relaxtune.decoding.serving.stops_paying_at``) is B, known in advance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from relaxtune.backends.base import Batch, SequenceState
from relaxtune.decoding.serving import ServingProfile
from relaxtune.decoding.speed import CostProfile

__all__ = ["Roofline", "SimServingPair"]


@dataclass(frozen=True)
class Roofline:
    """One model's cost per batched forward: ``fixed * max(1, rows * tokens / capacity)``
    virtual seconds (``fixed`` > 0 seconds, ``capacity`` > 0 tokens per forward)."""

    fixed: float
    capacity: float

    def seconds(self, rows: int, tokens: int) -> float:
        """Virtual seconds of one forward over ``rows`` rows of ``tokens`` tokens each."""
        return self.fixed * max(1.0, rows * tokens / self.capacity)


class SimServingPair:
    """A simulated pair (module doc) implementing ``relaxtune.backends.base.Backend``.

    Args:
        verifier, drafter: their ``Roofline`` costs.
        vocab_size: V, the width of the logit rows.
        noise: sd of the drafter's logits around the verifier's (larger: lower acceptance).
        seed: seeds both rows.

    Attributes:
        elapsed: virtual seconds spent in forwards so far (``clock`` reads it).
    """

    point_mass_drafts = False
    native = None

    def __init__(
        self,
        verifier: Roofline,
        drafter: Roofline,
        vocab_size: int = 16,
        noise: float = 0.5,
        seed: int = 0,
        name: str = "simulated serving pair",
    ) -> None:
        self.verifier_cost, self.drafter_cost = verifier, drafter
        self.vocab_size, self.name, self.batch_size = vocab_size, name, 1
        self.eos_token_ids: frozenset[int] = frozenset()
        g = torch.Generator().manual_seed(seed)
        self.z_p = torch.randn(vocab_size, generator=g) * 2.0
        self.z_q = self.z_p + torch.randn(vocab_size, generator=g) * noise
        self.elapsed = 0.0

    @classmethod
    def crossing_at(cls, batch_size: int, drafter_share: float = 0.1, **kw) -> SimServingPair:
        """A pair whose speculation stops paying at serving batch size ``batch_size``
        (module doc): the verifier's capacity is ``batch_size`` tokens, its fixed cost
        1 ms; the drafter's fixed cost ``drafter_share`` ms and its capacity 4x larger."""
        return cls(Roofline(1e-3, batch_size), Roofline(drafter_share * 1e-3, 4 * batch_size), **kw)

    def clock(self) -> float:
        """Virtual seconds so far (pass as the benchmark's clock)."""
        return self.elapsed

    def _spend(self, states: Sequence[SequenceState], seconds: float, model: str) -> None:
        self.elapsed += seconds
        for s in states:  # a forward's seconds shared equally among the rows it served
            if model == "draft":
                s.draft_seconds += seconds / len(states)
                s.draft_forwards += 1
            else:
                s.verify_seconds += seconds / len(states)
                s.verify_forwards += 1

    # --------------------------------------------------------------- the protocol

    def start_batch(self) -> Batch:
        """An empty batch."""
        return Batch()

    def join(self, batch: Batch, prompts: Sequence[Sequence[int]]) -> list[SequenceState]:
        """One row per prompt; each prompt's prefill costs one forward of each model over it."""
        new = []
        for p in prompts:
            if not p:
                raise ValueError("an empty prompt")
            state = SequenceState(tokens=list(p), prompt_len=len(p))
            seconds = self.verifier_cost.seconds(1, len(p)) + self.drafter_cost.seconds(1, len(p))
            self.elapsed += seconds
            state.prefill_seconds += seconds
            new.append(state)
        batch.states.extend(new)
        return new

    def leave(self, batch: Batch, rows: Sequence[int]) -> None:
        """Remove ``rows``."""
        gone = set(rows)
        batch.states = [s for i, s in enumerate(batch.states) if i not in gone]

    def draft_batch(self, batch: Batch, n: int, pick, extra_step: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` drafter steps (``n + 1`` with ``extra_step``), each one batched forward of one token per row."""
        rows = batch.rows
        z = self.z_q.expand(rows, self.vocab_size)
        ids = []
        for i in range(n + int(extra_step)):
            self._spend(batch.states, self.drafter_cost.seconds(rows, 1), "draft")
            if i < n:
                ids.append(pick(z, i))
        ids_t = torch.stack(ids, 1) if ids else torch.zeros(rows, 0, dtype=torch.long)
        return ids_t, self.z_q.expand(rows, n + int(extra_step), self.vocab_size).clone()

    def score_batch(self, batch: Batch, draft_ids: torch.Tensor) -> torch.Tensor:
        """One batched verifier forward over N + 1 tokens per row: rows ``[R, N+1, V]``."""
        rows, k = batch.rows, draft_ids.shape[1] + 1
        self._spend(batch.states, self.verifier_cost.seconds(rows, k), "verify")
        return self.z_p.expand(rows, k, self.vocab_size).clone()

    def commit_batch(self, batch: Batch, tokens: Sequence[Sequence[int]]) -> None:
        """Append each row's tokens (no caches to roll back)."""
        for state, t in zip(batch.states, tokens):
            state.tokens.extend(int(x) for x in t)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids as text."""
        return " ".join(str(i) for i in ids)

    # ---------------------------------------------------------------------- costs

    def cost_profile(
        self, prompt_ids: Sequence[int], n_drafts: Sequence[int], batch_sizes: Sequence[int] = (1,), **_
    ) -> ServingProfile:
        """The roofline's costs at each serving batch size (exact: nothing is timed),
        as the in-process backends' ``cost_profile`` returns measured ones."""
        v, d = self.verifier_cost, self.drafter_cost
        return ServingProfile(
            {
                b: CostProfile(
                    t_ar=v.seconds(b, 1),
                    t_draft=d.seconds(b, 1),
                    t_verify={n + 1: v.seconds(b, n + 1) for n in n_drafts},
                    source=f"{self.name}, batch {b} (roofline model)",
                    batch_size=b,
                )
                for b in sorted(set(batch_sizes))
            }
        )
