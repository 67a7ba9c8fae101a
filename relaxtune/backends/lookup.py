"""Prompt lookup (n-gram) drafting: a drafter without a model.

The drafts are the tokens that followed the latest earlier occurrence of the
context's last n-gram (prompt and committed output), trying ``n = max_ngram`` down
to ``min_ngram`` (Saxena's prompt lookup decoding: transformers'
``prompt_lookup_num_tokens``, SGLang's ``--speculative-algorithm NGRAM`` and
llama.cpp's lookup drafters do the same). The copy runs on into its own drafts
when the match sits near the end (an overlapping match continues its period), so a
match always yields N drafts; after an EOS the drafts repeat it (the response ends
there if it is accepted). With no match at any size the fallback drafts the last
token N times, drafts that almost always fail the test and cost nothing.

``PromptLookupBackend`` wraps the verifier's backend (in-process, batched or not,
or SGLang): it drafts by lookup and hands scoring, commits and everything else to
the wrapped backend. Its proposals are point masses: ``draft_batch`` returns logit rows
that are ``0`` at the drafted id and ``-inf`` elsewhere, and it sets the protocol's
``point_mass_drafts`` so the engine takes ``q`` as one-hot at the draft
(``relaxtune.backends.base``). Its cost per drafted token is measured like a
model drafter's (``cost_profile``): microseconds, ``c_rel`` near 0.

What a one-hot ``q = e_x`` means for each rule (accept probability, given
``q(x) = 1``; on rejection the residual ``norm((pi_res - e_x)+)`` is ``pi_res``
without ``x``):

- ``strict``: ``p(x)``; lossless, as with any drafter.
- ``always_accept``: 1: the output copies the context; degenerate (the verifier
  only picks the bonus token).
- ``ens``: ``(1 - alpha) p(x) + alpha``: accepts a copy the verifier excludes
  (``p(x) = 0``) with probability alpha: rambles.
- ``mentored``: ``min(1, p(x) / (1 - alpha))``; ``cactus``: ``h(p(x))``;
  ``sglang_threshold``: ``min(1, p(x) / t)`` (its own domain: deterministic
  drafts); ``ears``: ``min(1, p(x) + t (1 - max p))`` when ``p(x) > 0``, since
  ``q(x) = 1``; all verifier-anchored, meaningful, never ``p(x) = 0``.
- ``typical``: ``1[p(x) > threshold(p)]``: it never reads q; unchanged.
- ``r_fuzzy``: 1 where ``JS(p, e_x) <= tau``, else ``p(x)``: a threshold on how
  much mass p puts on the copy (``JS = ln 2`` when ``p(x) = 0``: only ``tau = ln 2``
  accepts it).
- ``spec_casc_opt``: ``max q = 1 >= max p - alpha TV`` for every ``alpha >= 0``: it
  degenerates to ``always_accept`` at 0 and 0.05 of the paper's grid; at
  ``alpha < 0`` it defers to q iff ``1 - max p >= -alpha (1 - p(x))``.
- ``spec_casc_tok``: 1 when ``x`` is in the verifier's near-argmax set A, else
  ``p(x)`` (strict); meaningful and verifier-anchored.
- ``spec_cont_dec``: the drafter's logits are 0 at ``x`` and unknown elsewhere,
  which count as the row's smallest known value (0): the contrast is flat and
  ``pi`` is ``p`` sharpened, ``p^(1 + beta)`` renormalised; no longer contrastive.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from ..decoding.serving import ServingProfile
from ..decoding.speed import MAX_PASSES, MIN_PASSES, measure_interleaved
from .base import Batch, BatchPick, SequenceState
from .naming import MAX_NGRAM, NAME, lookup_name, parse_lookup

# NAME and parse_lookup (the drafter's name) are named here too for their callers
__all__ = ["NAME", "lookup_drafts", "point_mass_rows", "parse_lookup", "PromptLookupBackend"]

MIN_NGRAM = 1


def lookup_drafts(
    context: Sequence[int],
    n: int,
    *,
    max_ngram: int = MAX_NGRAM,
    min_ngram: int = MIN_NGRAM,
    eos: frozenset[int] = frozenset(),
) -> tuple[list[int], int]:
    """Draft ``n`` tokens by prompt lookup.

    Args:
        context: the token ids so far (prompt and output).
        n: drafts wanted (>= 1).
        max_ngram, min_ngram: the n-gram sizes tried, largest first.
        eos: ids after which the drafts repeat the EOS.

    Returns:
        ``(drafts, size)``: ``n`` ids, and the size of the matched n-gram (0: no match,
        the fallback repeats the last token). The match is the latest earlier
        occurrence (it may overlap the final n-gram); the drafts copy what followed
        it, running on into the drafts themselves.

    Raises:
        ValueError: an empty context, ``n < 1`` or ``1 <= min_ngram <= max_ngram`` broken.
    """
    ctx = list(context)
    length = len(ctx)
    if not ctx or n < 1 or not 1 <= min_ngram <= max_ngram:
        raise ValueError(
            f"lookup needs a context, n >= 1 and 1 <= min_ngram <= max_ngram; got {length} tokens, "
            f"n = {n}, n-grams {min_ngram}..{max_ngram}"
        )
    for size in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        tail = ctx[length - size :]
        last = tail[-1]
        for end in range(length - 2, size - 2, -1):  # the occurrence ctx[end - size + 1 : end + 1], before the tail
            if ctx[end] == last and ctx[end - size + 1 : end + 1] == tail:
                return _copy(ctx, end + 1, n, eos), size
    return [ctx[-1]] * n, 0


def _copy(ctx: list[int], start: int, n: int, eos: frozenset[int]) -> list[int]:
    out: list[int] = []
    for k in range(n):
        if out and out[-1] in eos:
            out.append(out[-1])
            continue
        i = start + k  # < len(ctx) + len(out): the copy may run into its own drafts
        out.append(ctx[i] if i < len(ctx) else out[i - len(ctx)])
    return out


def point_mass_rows(ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    """Logit rows ``[len(ids), V]``: 0 at each id, ``-inf`` elsewhere (a point mass
    under any sampling transform)."""
    rows = torch.full((len(ids), vocab_size), float("-inf"))
    rows[torch.arange(len(ids)), torch.tensor(list(ids), dtype=torch.long)] = 0.0
    return rows


class PromptLookupBackend:
    """A backend whose drafter is prompt lookup, the verifier's backend wrapped.

    Args:
        verifier: the backend that scores (``HFBackend`` loaded without a drafter,
            batched or not, or ``SGLangBackend`` without a drafter server).
        max_ngram, min_ngram: the n-gram sizes tried, largest first.
        name: for records (default ``prompt-lookup-><verifier's name>``).

    Its batches are the verifier backend's (``batch_size`` is the verifier's);
    ``cost_profile`` exists when the verifier's backend can measure its own. The
    attributes a job reads of a backend (``tokenizer``, ``device``, ``runtime``,
    ``max_concurrency``, ``close``) are the verifier's, named one by one.

    Raises:
        ValueError: bad n-gram sizes.
    """

    point_mass_drafts = True
    drafter = None  # no drafter model
    native = None  # a native speculative server drafts with its own model: never used here

    def __init__(
        self, verifier, *, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM, name: str | None = None
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}..{max_ngram}")
        self.inner = verifier
        self.max_ngram, self.min_ngram = int(max_ngram), int(min_ngram)
        self.vocab_size = verifier.vocab_size
        self.eos_token_ids = verifier.eos_token_ids
        self.name = name or lookup_name(getattr(verifier, "name", "verifier"))
        self.batch_size = int(verifier.batch_size)
        self.tokenizer = getattr(verifier, "tokenizer", None)
        self.device = getattr(verifier, "device", "cpu")
        self.runtime = getattr(verifier, "runtime", None)
        self.max_concurrency = getattr(verifier, "max_concurrency", None)
        if hasattr(verifier, "cost_profile"):
            self.cost_profile = self._cost_profile
        if hasattr(verifier, "fit_context"):  # llama.cpp: its contexts sized to the task
            self.fit_context = verifier.fit_context

    def close(self) -> None:
        """Close the verifier backend (an SGLang client), when it can be closed."""
        if hasattr(self.inner, "close"):
            self.inner.close()

    def _lookup(self, state: SequenceState, n: int) -> list[int]:
        t0 = time.perf_counter()
        ids, _ = lookup_drafts(
            state.tokens, n, max_ngram=self.max_ngram, min_ngram=self.min_ngram, eos=self.eos_token_ids
        )
        state.draft_seconds += time.perf_counter() - t0
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The verifier backend's ``decode``."""
        return self.inner.decode(ids)

    # ----------------------------------------------------------------- batches

    def start_batch(self) -> Batch:
        """The verifier backend's empty batch."""
        return self.inner.start_batch()

    def join(self, batch: Batch, prompts: Sequence[Sequence[int]]) -> list[SequenceState]:
        """The verifier backend's ``join``."""
        return self.inner.join(batch, prompts)

    def leave(self, batch: Batch, rows: Sequence[int]) -> None:
        """The verifier backend's ``leave``."""
        self.inner.leave(batch, rows)

    def draft_batch(
        self, batch: Batch, n: int, pick: BatchPick, extra_step: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``n`` tokens for every row by lookup: ids ``[R, n]`` (``pick`` called
        once per step on the rows ``[R, V]``) and point-mass logit rows ``[R, n(+1), V]``."""
        k = n + int(extra_step)
        rows = torch.stack([point_mass_rows(self._lookup(s, k), self.vocab_size) for s in batch.states])
        ids = [pick(rows[:, i], i).long() for i in range(n)]
        return torch.stack(ids, 1), rows

    def score_batch(self, batch: Batch, draft_ids: torch.Tensor) -> torch.Tensor:
        """The verifier backend's ``score_batch``."""
        return self.inner.score_batch(batch, draft_ids)

    def commit_batch(self, batch: Batch, tokens: Sequence[Sequence[int]]) -> None:
        """The verifier backend's ``commit_batch``."""
        self.inner.commit_batch(batch, tokens)

    # ------------------------------------------------------------------- costs

    def draft_seconds(
        self, prompt_ids: Sequence[int], min_passes: int = MIN_PASSES, max_passes: int = MAX_PASSES
    ) -> tuple[float, float, int]:
        """Seconds per drafted token: one lookup and its logit row on the prompt plus
        64 tokens, timed over 100 calls per pass in interleaved passes
        (``measure_interleaved``). Returns ``(seconds, spread, passes)``."""
        state = SequenceState(
            tokens=[int(t) for t in prompt_ids] + [t % self.vocab_size for t in range(64)], prompt_len=len(prompt_ids)
        )
        calls = 100

        def job() -> None:
            for _ in range(calls):
                point_mass_rows(self._lookup(state, 1), self.vocab_size)

        fastest, spread, passes = measure_interleaved({"t_draft": job}, min_passes=min_passes, max_passes=max_passes)
        return fastest["t_draft"] / calls, spread["t_draft"], passes

    def _cost_profile(
        self,
        prompt_ids: Sequence[int],
        n_drafts: Sequence[int],
        batch_sizes: Sequence[int] = (1,),
        min_passes: int = MIN_PASSES,
        max_passes: int = MAX_PASSES,
        **kwargs,
    ) -> ServingProfile:
        """The verifier backend's serving profile with ``t_draft`` measured for lookup
        (``draft_seconds``): at batch size B, B lookups (a batch drafts row by row on
        the CPU, ``draft_batch``), so ``t_draft = B x`` one lookup's seconds.
        ``kwargs`` go to the verifier backend's ``cost_profile`` (its ``clock``)."""
        serving = self.inner.cost_profile(
            prompt_ids, n_drafts, batch_sizes, min_passes=min_passes, max_passes=max_passes, **kwargs
        )
        seconds, spread, _ = self.draft_seconds(prompt_ids, min_passes, max_passes)
        return ServingProfile(
            {
                b: replace(
                    p,
                    t_draft=seconds * b,
                    spread=p.spread | {"t_draft": spread},
                    source=f"{p.source}; drafter: prompt lookup (n-grams {self.max_ngram}..{self.min_ngram})",
                )
                for b, p in serving.profiles.items()
            },
            serving.weights,
        )
