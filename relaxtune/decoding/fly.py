"""vLLM's FLy (``rejection_sample_method: "fly"``, first in vLLM 0.33.0): a native
rejection becomes an acceptance when the verifier's top-k entropy at that position
is high enough and the next W drafts of the same round are natively accepted (a
look-ahead inside the round: a round-level rule, ``relaxtune.decoding.hooks``).

Source, vLLM 0.33.0 (wheel ``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64``, notes in
``docs/reference/engine-rules.md`` section 1):
- ``vllm/config/speculative.py:652-660`` knobs ``fly_window_size`` (int >= 1, None ->
  ``min(6, num_speculative_tokens - 1)``), ``fly_entropy_threshold`` (float >= 0,
  default 0.3), ``fly_entropy_top_k`` (int >= 1, default 3); validation at
  :2014-2033: ``num_speculative_tokens >= 2`` and ``fly_window_size <
  num_speculative_tokens``.
- ``vllm/v1/spec_decode/fly.py``: ``compute_fly_entropy`` (:16-43),
  ``apply_fly_greedy_acceptance_kernel`` (:47-98, greedy requests: edits the target
  argmax), ``apply_fly_random_acceptance_kernel`` (:103-188, sampled requests: sets the
  native uniform to 0); called from ``vllm/v1/sample/rejection_sampler.py`` :500-507
  (ModelRunnerV1). (The indexed main snapshot, vllm-project/vllm@1719fb1, reads
  the top-k from the environment variable ``VLLM_FLY_ENTROPY_TOP_K`` instead; the
  rule is the same.)

Transcribed, not copied. Shapes: ``p``, ``q`` ``[B, N(+1), V]``, drafts ``[B, N]``.
"""

from __future__ import annotations

from typing import Any

import torch

from .hooks import RoundContext, RoundRule
from .rules import Rows, Targets

__all__ = [
    "FLY_WINDOW",
    "FLY_THRESHOLD",
    "FLY_TOP_K",
    "FLY_DEFAULT_TOP_K",
    "fly",
    "fly_entropy",
    "fly_window",
    "fly_check",
    "fly_accept",
    "FLY_RULE",
]

FLY_WINDOW = "fly_window_size"
FLY_THRESHOLD = "fly_entropy_threshold"
FLY_TOP_K = "fly_entropy_top_k"
FLY_DEFAULT_TOP_K = 3
FLY_DEFAULT_THRESHOLD = 0.3
FLY_MAX_DEFAULT_WINDOW = 6


def fly(rows: Rows, knobs: Any = None) -> Targets:
    """FLy's per-position view: ``pi_rej = pi_res = p``. The native test is strict
    speculative sampling (vLLM's ``P / q >= u``; relaxtune's ``u < p / q``, equal but
    at the tie ``u = p / q``); the residual after the first rejection is the native
    one, ``norm((p - q)+)`` (vLLM's ``sample_recovered_tokens``: ``max(P - Q, 0)``, or
    P without the draft when no draft probabilities are passed, i.e. one-hot q); the
    bonus token comes from ``p``. FLy's deferral, which reads later positions of the
    round, is ``fly_accept`` (the round-level hook); FLy itself draws no random
    numbers, it reuses the native uniforms.
    """
    return Targets(rows.p, rows.p)


def fly_entropy(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """FLy's top-k entropy in nats, ``[..., V] -> [...]``: ``-sum p log p`` over the
    ``min(top_k, V)`` largest probabilities, NOT renormalised within the top-k, in
    float32 (``compute_fly_entropy``, vLLM 0.33.0 ``v1/spec_decode/fly.py``)."""
    top = torch.topk(probs.float(), k=min(int(top_k), probs.shape[-1]), dim=-1).values
    return -torch.where(top > 0, top * top.log(), torch.zeros_like(top)).sum(-1)


def fly_window(knobs: dict[str, Any], n: int) -> int:
    """The window W: ``fly_window_size``, or vLLM's default ``min(6, N - 1)`` when None."""
    w = knobs.get(FLY_WINDOW)
    return min(FLY_MAX_DEFAULT_WINDOW, n - 1) if w is None else int(w)


def fly_check(n: int, knobs: dict[str, Any]) -> None:
    """vLLM's validation (``config/speculative.py`` :2014-2033, 0.33.0).

    Raises:
        ValueError: ``N < 2``, or ``fly_window_size >= N``.
    """
    if n < 2:
        raise ValueError(f"fly needs num_speculative_tokens >= 2 (vLLM 0.33.0 refuses N = {n})")
    w = fly_window(knobs, n)
    if w >= n:
        raise ValueError(f"fly needs fly_window_size < num_speculative_tokens: W = {w}, N = {n} (vLLM 0.33.0)")


def _window_accepted(native: torch.Tensor, w: int) -> torch.Tensor:
    """``[B, N]`` bool: position i has ``i + w < N`` and positions ``i+1 .. i+w`` all
    natively accepted (the ORIGINAL verdicts, as both vLLM kernels read them)."""
    b, n = native.shape
    cs = torch.zeros(b, n + 1, dtype=torch.long)
    cs[:, 1:] = native.long().cumsum(-1)
    out = torch.zeros(b, n, dtype=torch.bool)
    if n - w > 0:
        i = torch.arange(n - w)
        out[:, : n - w] = (cs[:, i + w + 1] - cs[:, i + 1]) == w
    return out


def fly_accept(ctx: RoundContext) -> torch.Tensor:
    """FLy's verdicts for one round, ``[B, N]`` bool: the native verdict, or a
    deferred rejection (vLLM 0.33.0 ``apply_fly_*_acceptance_kernel``).

    A native rejection at ``i`` (0-based) becomes an acceptance iff the draft is in
    the vocabulary, ``i + W < N``, the entropy at ``i`` is ``>= fly_entropy_threshold``,
    positions ``i+1 .. i+W`` are natively accepted, and:
    - sampled requests (T > 0): ``q(x) > 0`` and ``P(x) > 0``, with ``P`` the
      processed target row (``p`` here, after temperature/top-k/top-p) and the
      entropy from ``P`` (``apply_fly_random_acceptance_kernel``: u := 0);
    - greedy requests (T = 0): the target logit of the draft is finite, and the
      entropy comes from ``softmax(z_p)``: vLLM sets T := 1 for greedy rows
      before its softmax (``apply_fly_greedy_acceptance_kernel``: argmax := draft).
      Needs the raw verifier logits ``z_p``.
    Positions within W of the draft's end are never flipped. A flip never accepts a
    token the verifier excludes.

    Raises:
        ValueError: greedy (T = 0) without ``z_p``.
    """
    n = ctx.x.shape[1]
    w = fly_window(ctx.knobs, n)
    theta = float(ctx.knobs[FLY_THRESHOLD])
    top_k = int(ctx.knobs[FLY_TOP_K])
    x = ctx.x.unsqueeze(-1)
    native = ctx.native
    if ctx.temperature == 0:
        if ctx.z_p is None:
            raise ValueError(
                "fly at temperature 0 needs the raw verifier logits z_p: vLLM's greedy path takes "
                "the entropy of softmax(logits) at T = 1"
            )
        z = ctx.z_p[:, :n].float()
        entropy = fly_entropy(z.softmax(-1), top_k)
        in_support = z.gather(-1, x).squeeze(-1) > float("-inf")
    else:
        p = ctx.p[:, :n]
        entropy = fly_entropy(p, top_k)
        in_support = (p.gather(-1, x).squeeze(-1) > 0) & (ctx.q[:, :n].gather(-1, x).squeeze(-1) > 0)
    defer = ~native & in_support & (entropy >= theta) & _window_accepted(native, w)
    return native | defer


FLY_RULE = RoundRule(accept=fly_accept, check=fly_check)
