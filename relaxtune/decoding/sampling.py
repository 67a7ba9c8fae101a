"""The sampling transform (temperature, top-k, top-p) and seeded sampling.

The transform is applied in the order temperature -> top-k -> top-p, each on the
renormalised output of the previous step, as vLLM and SGLang do and as the paper
uses it (T = 0.6, top-k = 20, top-p = 0.95 for both models; see
``docs/concepts/relaxed-rules.md``, "Notation"). Ties at the top-k boundary are
kept (as transformers' ``TopKLogitsWarper``). With a top-k cut, top-p runs on the
k kept values only (sorting a 152k-token row costs about 20 ms on a CPU). Temperature 0 is greedy: a one-hot
row at the arg-max (the first index among exact ties).

Rows come dense (``[..., V]`` logits) or sparse (``[..., K]`` token ids with their
raw log-probabilities, the layout a server returns). Where the sparse top-K covers
the support of the transformed distribution (top-k cut ``k <= K``), both give the
same distribution exactly.

Sampling is by inverse CDF from explicit uniforms, so a caller decides how much
randomness is consumed: one uniform per sampled token, whatever the row holds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

__all__ = [
    "SamplingParams",
    "transform_logits",
    "transform_sparse",
    "sparse_to_dense",
    "sample_from_rows",
    "draw_uniforms",
]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling transform settings.

    Attributes:
        temperature: T >= 0; 0 means greedy (arg-max).
        top_k: keep the k most likely tokens (ties kept); 0 or None disables.
        top_p: nucleus mass in (0, 1]; 1.0 disables.

    Raises:
        ValueError: on a negative or non-finite temperature, a negative top_k, or
            top_p outside (0, 1].
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t = float(self.temperature)
        if not (t >= 0.0 and t < float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.top_k is not None and (int(self.top_k) != self.top_k or self.top_k < 0):
            raise ValueError(f"top_k must be a non-negative integer (0 or None disables), got {self.top_k!r}")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        """True when T = 0 (arg-max decoding)."""
        return self.temperature == 0.0


def _top_p_mask(probs_sorted: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep-mask over descending-sorted probabilities: a token is kept when the
    mass strictly before it is below ``top_p`` (the first token is always kept)."""
    before = probs_sorted.cumsum(-1) - probs_sorted
    return before < top_p


def transform_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply the sampling transform to dense logits.

    Args:
        logits: raw logits ``[..., V]`` (any float dtype; computed in float32 or wider).
        params: the transform.

    Returns:
        Probabilities ``[..., V]``, float32 (float64 if the input is float64),
        rows summing to 1; zero outside the kept support.
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    z = logits.to(dtype)
    if params.greedy:
        out = torch.zeros_like(z)
        return out.scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
    if params.top_k and params.top_k < z.shape[-1]:
        k = params.top_k
        top, where = z.topk(k + 1, dim=-1)  # sorted, descending; the (k+1)-th shows a tie at the cut
        top = top / params.temperature
        if not bool((top[..., k:] == top[..., k - 1 : k]).any()):
            # no tie at the cut (the usual case): top-p over the k kept values only, instead of a sort of all V
            return torch.zeros_like(z).scatter_(-1, where[..., :k], _nucleus(top[..., :k].softmax(-1), params.top_p))
        z = z / params.temperature
        z = z.masked_fill(z < top[..., k - 1 : k], float("-inf"))
    else:
        z = z / params.temperature
    probs = z.softmax(-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        probs = torch.zeros_like(sorted_probs).scatter_(-1, order, _nucleus(sorted_probs, params.top_p))
    return probs


def _nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over probabilities sorted in descending order: the kept ones,
    renormalised (zero elsewhere); the rows themselves when ``top_p`` is 1."""
    if top_p >= 1.0:
        return sorted_probs
    kept = sorted_probs * _top_p_mask(sorted_probs, top_p)
    return kept / kept.sum(-1, keepdim=True)


def transform_sparse(
    ids: torch.Tensor, logprobs: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Apply the sampling transform to sparse top-K rows.

    Args:
        ids: token ids ``[..., K]`` (int64).
        logprobs: their raw log-probabilities ``[..., K]`` (nats, ``log_softmax`` of
            the raw logits over the full vocabulary; ``-inf`` allowed for padding).
        params: the transform.

    Returns:
        ``(ids, probs, missing_mass)``: the same ids ``[..., K]``, probabilities
        ``[..., K]`` (float32) renormalised over the kept tokens, and the raw
        probability mass outside the top-K ``[...]`` (``1 - sum(exp(logprobs))``).
        The result is exact when the transform's support lies inside the top-K
        (``top_k <= K`` or greedy); otherwise it is the transform of the
        truncated row and ``missing_mass`` says how much was truncated.

    Raises:
        ValueError: if ``ids`` and ``logprobs`` differ in shape.
    """
    if ids.shape != logprobs.shape:
        raise ValueError(f"ids {tuple(ids.shape)} and logprobs {tuple(logprobs.shape)} must have the same shape")
    lp = logprobs.to(torch.float64)
    missing = (1.0 - lp.exp().sum(-1)).clamp_min(0.0).to(torch.float32)
    probs = transform_logits(lp, params).to(torch.float32)
    return ids, probs, missing


def sparse_to_dense(ids: torch.Tensor, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Scatter sparse probabilities ``[..., K]`` at ``ids`` into dense rows ``[..., V]``.

    Raises:
        ValueError: if an id is outside ``[0, vocab_size)``.
    """
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got range [{int(ids.min())}, {int(ids.max())}]")
    out = torch.zeros(*probs.shape[:-1], vocab_size, dtype=probs.dtype, device=probs.device)
    return out.scatter_add_(-1, ids.long(), probs)


@functools.lru_cache(maxsize=64)
def _block_size(v: int) -> int:
    """A block size near sqrt(V) that divides V (no padding copy), else sqrt(V)."""
    root = math.isqrt(v)
    for d in range(root, max(16, root // 8) - 1, -1):
        if v % d == 0:
            return d
    return max(16, root + 1)


def sample_from_rows(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling from non-negative, possibly unnormalised rows.

    Token ``y`` is returned when ``u * sum(row)`` falls in ``[cdf(y-1), cdf(y))``, so
    a token of zero mass is never returned. Two levels: the block (about sqrt(V)
    tokens) is found from the cumulative block sums (float64), then the token
    inside it from the block's own float64 cumulative sum, at the same fraction
    of the block's mass; one pass over the row instead of a full-length cumsum.

    Args:
        rows: ``[R, V]`` non-negative weights, each row with positive sum.
        u: ``[R]`` uniforms in ``[0, 1)``.

    Returns:
        ``[R]`` int64 token ids.
    """
    r, v = rows.shape
    block = _block_size(v)
    nb = -(-v // block)
    if nb * block != v:
        rows = torch.nn.functional.pad(rows, (0, nb * block - v))
    blocks = rows.contiguous().view(r * nb, block)
    mass = blocks.sum(-1).view(r, nb).to(torch.float64)  # [R, nb]
    cdf = mass.cumsum(-1)
    target = u.to(torch.float64) * cdf[:, -1]
    b = torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1).clamp_max_(nb - 1)
    # the target's position inside its block, as a fraction of the block's mass
    mass_b = mass.gather(-1, b.unsqueeze(-1)).squeeze(-1)
    frac = (target - (cdf.gather(-1, b.unsqueeze(-1)).squeeze(-1) - mass_b)) / mass_b
    inner = blocks.index_select(0, torch.arange(r) * nb + b).to(torch.float64).cumsum_(-1)  # [R, block]
    i = torch.searchsorted(inner, (frac * inner[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    # float error can leave the fraction a hair over 1: take the block's last positive token
    last_pos = (inner < inner[:, -1:]).sum(-1)
    return b * block + torch.minimum(i, last_pos)


def draw_uniforms(shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniforms in ``[0, 1)`` (float32) from ``generator`` (CPU)."""
    return torch.rand(shape, generator=generator, dtype=torch.float32)
