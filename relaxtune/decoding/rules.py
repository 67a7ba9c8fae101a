"""Relaxed speculative sampling rules: one pure function per method.

Every method defines, per drafted position, relaxed targets ``pi_rej`` (used by
the accept test ``u < pi_rej(x) / q(x)``) and ``pi_res`` (the residual is
``norm((pi_res - q)+)``); the round takes its bonus token from ``p`` or, for
``spec_cont_dec``, from the method's own ``pi``. With ``pi_rej = pi_res = p`` this
is Leviathan et al. (2023) / Chen et al. (2023) speculative sampling.

Source of every rule: Xia, Ribar and Balanca, "A Practical Investigation of
Training-free Relaxed Speculative Decoding" (arXiv 2607.08690, 2026), the unified
table reproduced in ``docs/concepts/relaxed-rules.md``. Rules never see a
model: only probability rows (and raw logits for the two methods that need them).
Each rule also has a ``*_at`` form giving ``pi_rej(x)`` alone, which is all
the accept test reads; full target rows are built only at the rejected position.
The registry of methods (knob ranges, strict points, needs) is
``relaxtune.decoding.methods``.

Shapes: ``p`` and ``q`` are ``[..., V]`` probability rows after the sampling
transform; ``x`` is ``[...]`` (the drafted token at each row); ``z_p`` / ``z_q``
are raw logits ``[..., V]``. Every rule returns ``Targets`` with
``pi_rej`` and ``pi_res`` of shape ``[..., V]``.

Rows from a server's top-K (``relaxtune.backends.sglang``): ``z_p`` / ``z_q`` are
raw log-probabilities, ``-inf`` outside the returned ids (the top-K, the draft's
own logprob, the drafter's candidates), so ``p`` and ``q`` are 0 there and the
truncated mass is recorded per position (``missing_mass``). Every rule is
defined on such rows (each docstring says how) and never returns NaN for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Rows", "Targets", "js_divergence", "cactus_h"]

JS_FLOOR = 1e-30  # floor inside the logs of the JS divergence (the paper's code)


@dataclass(frozen=True)
class Rows:
    """The inputs a method sees at a set of positions.

    Attributes:
        p: verifier probabilities ``[..., V]`` (after the sampling transform).
        q: drafter probabilities ``[..., V]`` (same transform).
        x: drafted token ids ``[...]`` (int64), or None at the bonus position.
        z_p: raw verifier logits ``[..., V]`` (only for methods that need them).
        z_q: raw drafter logits ``[..., V]`` (only ``spec_cont_dec``).
        temperature: the transform's T (only ``spec_cont_dec``).
    """

    p: torch.Tensor
    q: torch.Tensor
    x: torch.Tensor | None = None
    z_p: torch.Tensor | None = None
    z_q: torch.Tensor | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class Targets:
    """Relaxed targets ``pi_rej`` and ``pi_res``, each ``[..., V]``.

    ``pi_rej`` need not be a distribution (``mentored`` scales ``p`` up); ``pi_res``
    is one for every method.
    """

    pi_rej: torch.Tensor
    pi_res: torch.Tensor


# --------------------------------------------------------------------------- rules


def strict(rows: Rows, knob: float | None = None) -> Targets:
    """Strict speculative sampling: ``pi_rej = pi_res = p`` (Leviathan et al. 2023, Alg. 1).

    Top-K rows: the test reads ``p(x)``, exact (a server returns the draft's own
    logprob); the residual ``norm((p - q)+)`` spans the returned ids."""
    return Targets(rows.p, rows.p)


def always_accept(rows: Rows, knob: float | None = None) -> Targets:
    """Accept every draft: ``pi_rej = q`` (ratio 1). A draft with ``q(x) = 0`` (never
    sampled from q) is rejected and the residual falls back to ``pi_res = q``.
    The bonus token still comes from ``p``. Top-K rows: reads only ``q``, whose
    drafts are sampled among the returned ids, so ``q(x) > 0``."""
    return Targets(rows.q, rows.q)


def ens(rows: Rows, alpha: float) -> Targets:
    """Ensemble target ``pi = w p + (1 - w) q`` with verifier weight ``w = 1 - alpha``.

    ``pi_rej = pi_res = pi``, so emitted tokens follow ``pi`` exactly; the residual
    ``norm((pi - q)+) = norm((p - q)+)``. ``alpha = 0`` is strict, ``alpha = 1`` is
    ``always_accept``. Paper grid: w in {0.95, 0.9, 0.8}.
    Deployable: transformers 5.14.0+ ``assistant_ensemble_weight = 1 - alpha``
    (sampling path; ``engine_rules.ensemble_weight``, which names the empty-residual
    fall-back difference).
    Top-K rows: ``pi`` mixes the two rows, 0 where neither returned the token.
    """
    w = 1.0 - alpha
    pi = rows.p * w + rows.q * alpha
    return Targets(pi, pi)


def mentored(rows: Rows, alpha: float) -> Targets:
    """Mentored decoding: accept ``x`` w.p. ``min(1, p(x) / ((1 - alpha) q(x)))``,
    residual from ``p``: ``pi_rej = p / (1 - alpha)``, ``pi_res = p``.

    Closed form (one position, drafts ``x ~ q``): acceptance rate
    ``beta = sum_x min(q(x), p(x) / (1 - alpha))`` and emitted distribution
    ``P(y) = min(q(y), p(y) / (1 - alpha)) + (1 - beta) norm((p - q)+)(y)``.
    ``alpha = 0`` is strict. Paper grid: {0.3, 0.7, 0.95}.
    Top-K rows: reads the exact ``p(x)``; the residual spans the returned ids.
    """
    return Targets(rows.p / (1.0 - alpha), rows.p)


def cactus_h(p_x: torch.Tensor, delta: float) -> torch.Tensor:
    """CACTUS boosted probability of the drafted token,
    ``h = min(1, p(x) + sqrt(2 delta p(x) (1 - p(x))))`` (shape of ``p_x``)."""
    return (p_x + (2.0 * delta * p_x * (1.0 - p_x)).clamp_min(0.0).sqrt()).clamp(0.0, 1.0)


def cactus(rows: Rows, delta: float) -> Targets:
    """CACTUS: boost only the drafted token to ``h`` and shrink the rest of ``p``.

    ``H_x(x) = h``, ``H_x(y) = p(y) (1 - h) / (1 - p(x))`` for ``y != x`` (scale 1
    when ``p(x) = 1``), clipped to [0, 1]; ``pi_rej = pi_res = H_x``. Since
    ``h = 0`` whenever ``p(x) = 0``, a token the verifier excludes is never
    accepted. The CACTUS paper swaps the letters (their q is the verifier).

    Closed form (one position): acceptance ``beta = sum_x min(q(x), h_x)``,
    emitted ``P(y) = min(q(y), h_y) + sum_x (q(x) - min(q(x), h_x)) norm((H_x - q)+)(y)``.
    ``delta = 0`` is strict. Paper grid: {0.1, 0.25, 1, 10}.
    Top-K rows: ``h`` comes from the exact ``p(x)``; ``H_x`` rescales the returned
    ``p(y)`` and is 0 elsewhere.
    """
    if rows.x is None:
        raise ValueError("cactus needs the drafted token x")
    p_x = rows.p.gather(-1, rows.x.unsqueeze(-1))
    h = cactus_h(p_x, delta)
    denom = 1.0 - p_x
    # scale first, so delta = 0 gives (1 - p(x)) / (1 - p(x)) = 1 exactly (bit-identical strict)
    scale = torch.where(denom > 0, (1.0 - h) / denom.clamp_min(torch.finfo(denom.dtype).tiny), torch.ones_like(h))
    big_h = (rows.p * scale).scatter(-1, rows.x.unsqueeze(-1), h).clamp_(0.0, 1.0)
    return Targets(big_h, big_h)


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in nats, ``[..., V] -> [...]``, with a 1e-30 floor
    inside the logs; zero entries contribute 0. Bounded by ln 2.

    ``JS = 0.5 KL(p || m) + 0.5 KL(q || m)``, ``m = (p + q) / 2``, computed as
    ``0.5 sum p (log p - log(p + q)) + 0.5 sum q (log q - log(p + q)) + ln 2``.
    """
    log_s = (p + q).clamp_min_(2 * JS_FLOOR).log_()
    kl_p = torch.linalg.vecdot(p, p.clamp_min(JS_FLOOR).log_().sub_(log_s))
    kl_q = torch.linalg.vecdot(q, q.clamp_min(JS_FLOOR).log_().sub_(log_s))
    return (0.5 * (kl_p + kl_q) + math.log(2.0)).clamp_min_(0.0)


def _never(rows: Rows) -> torch.Tensor:
    return torch.zeros(rows.p.shape[:-1], dtype=torch.bool, device=rows.p.device)


def _switch(use_q: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> Targets:
    pi = torch.where(use_q.unsqueeze(-1), q, p)
    return Targets(pi, pi)


def _r_fuzzy_uses_q(rows: Rows, tau: float) -> torch.Tensor:
    if tau < 0:  # JS >= 0 > tau: never switches (no need to compute it)
        return _never(rows)
    return js_divergence(rows.p, rows.q) <= tau


def r_fuzzy(rows: Rows, tau: float) -> Targets:
    """Probabilistic fuzzy speculative decoding: ``pi = q`` if ``JS(p, q) <= tau``
    (nats) else ``p``. ``tau < 0`` is strict. Paper grid: {0.05, 0.2, 0.3}.
    Top-K rows: JS over the returned ids (a token 0 in both rows adds 0); a
    token only one row returned counts as 0 in the other."""
    return _switch(_r_fuzzy_uses_q(rows, tau), rows.p, rows.q)


def _casc_opt_uses_q(rows: Rows, alpha: float) -> torch.Tensor:
    if alpha == float("-inf"):
        return _never(rows)
    tv = (rows.p - rows.q).clamp_min_(0.0).sum(-1)
    return rows.q.amax(-1) >= rows.p.amax(-1) - alpha * tv


def spec_casc_opt(rows: Rows, alpha: float) -> Targets:
    """Speculative cascade, OPT deferral (Narasimhan et al. 2025):
    ``pi = q`` if ``max q >= max p - alpha TV(p, q)`` else ``p``, ``TV = sum (p - q)+``.
    Strict only as ``alpha -> -inf`` (``alpha = 0`` is NOT strict).
    Paper grid: {-0.1, 0, 0.05}. Top-K rows: maxima and TV over the returned ids."""
    return _switch(_casc_opt_uses_q(rows, alpha), rows.p, rows.q)


def _casc_tok_set(rows: Rows, alpha: float) -> torch.Tensor:
    """Indicator of ``A`` as 0./1. ``[..., V]``, in the logit domain:
    ``softmax(z_p)(v) >= (1 - alpha) max softmax(z_p)`` iff
    ``z_p(v) >= max z_p + log(1 - alpha)``; ``alpha = 1`` is every token (also
    one with ``z_p = -inf``, outside a server's top-K)."""
    if rows.z_p is None:
        raise ValueError("spec_casc_tok needs the raw verifier logits z_p")
    z = rows.z_p.float()
    if alpha >= 1:  # the threshold is -inf: -inf - (-inf) below would be NaN
        return torch.ones_like(z)
    thr = z.amax(-1, keepdim=True) + math.log1p(-alpha)
    # 1 where z >= thr: sign(z - thr) + 1 in {0, 1, 2}, capped at 1 (faster than a bool mask)
    return (z - thr).sign_().add_(1.0).clamp_max_(1.0)


def spec_casc_tok(rows: Rows, alpha: float) -> Targets:
    """Speculative cascade, token-level deferral:
    ``pi = q 1[v in A] + eta p`` with
    ``A = {v : softmax(z_p)(v) >= (1 - alpha) max softmax(z_p)}`` (raw verifier
    logits, no temperature) and ``eta = sum_{v not in A} q(v)``. A proper
    distribution. ``A`` is empty (strict) for ``alpha < 0``; ``alpha = 0`` gives
    ``A = argmax`` and is NOT strict. Paper grid: {0, 0.35, 0.8}.
    Top-K rows: a token without a returned logprob (``z_p = -inf``) is outside
    ``A`` unless ``alpha = 1`` (``A`` = every token, ``pi = q``); a server backend
    returns the verifier's logprob of every token the drafter's rows hold, so
    ``q 1[A]`` and ``eta`` are exact."""
    if alpha < 0:
        return Targets(rows.p, rows.p)
    q_in = rows.q * _casc_tok_set(rows, alpha)
    eta = (1.0 - q_in.sum(-1, keepdim=True)).clamp_min_(0.0)
    pi = q_in + eta * rows.p
    return Targets(pi, pi)


def _floor_unknown(z: torch.Tensor) -> torch.Tensor:
    """``z`` ``[..., V]`` with each ``-inf`` (no logprob returned: outside a server's
    top-K) replaced by the row's smallest finite entry, an upper bound of the
    unknown value. Rows without ``-inf`` (a model's logits) cost one reduction
    and come back as they are."""
    z = z.float()
    if not bool(z.amin() == -math.inf):
        return z
    floor = z.masked_fill(z.isneginf(), math.inf).amin(-1, keepdim=True)
    return torch.maximum(z, floor)


def _cont_dec_scores(rows: Rows, beta: float) -> torch.Tensor:
    """``(1 + beta) log p - beta z_q / T`` ``[..., V]``: on ``G = supp(p)`` this is
    ``((1 + beta) z_p - beta z_q) / T`` up to a per-row constant (there
    ``log p = z_p / T - log Z_G``), and ``-inf`` outside G, so a plain softmax of it
    is the softmax over G. ``z_q = -inf`` (unknown) counts as the row's smallest
    known drafter logit (``_floor_unknown``): ``-beta z_q`` would be ``+inf``
    (NaN after the softmax) on a token of G."""
    if rows.z_q is None or not rows.temperature:
        raise ValueError("spec_cont_dec needs the raw drafter logits z_q and a temperature > 0")
    return rows.p.log().mul_(1.0 + beta).sub_(_floor_unknown(rows.z_q), alpha=beta / rows.temperature)


def spec_cont_dec(rows: Rows, beta: float) -> Targets:
    """Speculative contrastive decoding (Yuan et al. 2023):
    ``pi = softmax over G of ((1 + beta) z_p - beta z_q) / T``, ``G = supp(p)``.
    ``pi_rej = pi_res = pi``; the bonus token is drawn from ``pi`` at N+1, which
    costs one extra drafter step per fully accepted round. ``beta = 0`` is
    exactly ``p`` (strict). Computed from ``p`` and ``z_q`` (``_cont_dec_scores``):
    the verifier's raw logits are not needed. Paper grid: {0.1, 0.5, 1}.
    Top-K rows: ``G`` is the returned ids the transform keeps (exactly the
    verifier's top-k under a top-k cut ``k <= K``). A token of ``G`` the drafter
    returned no logprob for has ``z_q`` at most the drafter row's smallest
    returned logprob; that bound stands in for it, the smallest contrastive
    boost the truth allows (``_floor_unknown``)."""
    if beta == 0.0:
        return Targets(rows.p, rows.p)
    pi = _cont_dec_scores(rows, beta).softmax(-1)
    return Targets(pi, pi)


SGLANG_SINGLE = "speculative_accept_threshold_single"
SGLANG_ACC = "speculative_accept_threshold_acc"
SGLANG_ACC_FLOOR = 1e-9  # the kernel clamps threshold_acc to at least this


def sglang_thresholds(t) -> tuple[float, float]:
    """``(threshold_single, threshold_acc)`` from one number (both tied to it: the
    tuner's alpha view) or a mapping under SGLang's own names."""
    if hasattr(t, "keys"):
        return float(t[SGLANG_SINGLE]), float(t[SGLANG_ACC])
    return float(t), float(t)


def sglang_tied(acc: float, further: dict) -> dict:
    """The one form of an SGLang threshold pair (``MethodSpec.canonical``): a single
    threshold at or above the acc threshold is the tied rule (``single = acc``), since
    ``p >= single >= acc`` already passes ``u < p / acc`` (``u`` in [0, 1)); ``_threshold_rej``
    gives the same ``pi_rej`` bit for bit. Not below the kernel's floor on acc
    (``SGLANG_ACC_FLOOR``): there the clamped ratio can fall short of 1 where the tied
    rule accepts outright.

    Args:
        acc: ``speculative_accept_threshold_acc`` (alpha); further: ``{SGLANG_SINGLE: s}``.

    Returns:
        ``further`` with ``s`` set to ``acc`` when the pair is the tied rule.
    """
    if acc >= SGLANG_ACC_FLOOR and further[SGLANG_SINGLE] >= acc:
        return further | {SGLANG_SINGLE: acc}
    return further


def sglang_threshold(rows: Rows, t) -> Targets:
    """SGLang's native relaxation (``--speculative-accept-threshold-single s
    --speculative-accept-threshold-acc a`` on a STANDALONE speculative server):
    the target-only kernel (SGLang 0.5.23 wheel,
    ``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``,
    ``TreeSpeculativeSamplingTargetOnly``, chain case ``--speculative-eagle-topk 1``)
    accepts the draft iff ``p(x) > 0`` and (``u < p(x) / a`` or ``p(x) >= s``), and on
    rejection samples from ``relu(p - p(x) e_x)`` (p without x); drafts are the
    drafter's argmax. ``a`` is clamped to at least 1e-9 (the kernel's host code);
    both knobs lie in [0, 1] (its ``CHECK_HOST``). Server-wide, CUDA only, non-greedy
    rows only; changeable at run time by ``POST /set_internal_state``.

    ``t``: a mapping ``{speculative_accept_threshold_single: s,
    speculative_accept_threshold_acc: a}`` (SGLang's names), or one number t for
    ``s = a = t`` (the tuner's single-knob view; then ``s`` is redundant:
    ``p >= t`` already passes ``u < p / t``).

    With greedy drafts (``q = e_x``, one-hot) this is the generalised round with
    ``pi_rej = 1`` where ``p >= s`` and ``p > 0``, else ``min(1, p / a)``, and
    ``pi_res = p``: the residual ``norm((p - e_x)+)`` is p without x. Closed form (one
    position, draft x, tied ``s = a = t``): acceptance ``min(1, p(x) / t)``, emitted
    ``P(y) = min(1, p(x)/t) [y = x] + (1 - min(1, p(x)/t)) p(y) [y != x] / (1 - p(x))``.
    ``s = a = 1`` (SGLang's defaults) is strict; ``s = 0`` accepts every draft the
    verifier gives positive probability, never one with ``p(x) = 0``.
    Not a method of the paper: here to compare the built-in relaxation with its rules.
    Top-K rows: reads the exact ``p(x)``; the residual spans the returned ids.
    """
    if rows.x is None:
        raise ValueError("sglang_threshold needs the drafted token x")
    return Targets(_threshold_rej(rows.p, t), rows.p)


def _threshold_rej(p: torch.Tensor, t) -> torch.Tensor:
    """1 where ``p >= s`` and ``p > 0`` (accept outright), else ``min(1, p / a)`` (shape
    of ``p``): 0 where ``p = 0``, even at ``s = 0`` (the kernel's ``has_target_mass``).
    For tied thresholds this is the one-number form, bit for bit."""
    single, acc = sglang_thresholds(t)
    if single == acc:
        if single <= 0:  # p >= 0 always holds: only the mass test is left
            return (p > 0).to(p.dtype)
        return torch.where(p >= single, torch.ones_like(p), p / single)  # p = 0 < t gives 0 / t = 0
    ratio = (p / max(acc, SGLANG_ACC_FLOOR)).clamp_max(1.0)
    return torch.where((p >= single) & (p > 0), torch.ones_like(p), ratio)


# ------------------------------------------------------------ pi_rej at the draft
# ``(Rows, knob) -> pi_rej(x)`` of shape ``[...]``: what the accept test needs,
# without building full target rows. Point methods read only p(x) and q(x).


def _at(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t.gather(-1, x.unsqueeze(-1)).squeeze(-1)


def _strict_at(rows: Rows, knob: float | None) -> torch.Tensor:
    return _at(rows.p, rows.x)


def _always_at(rows: Rows, knob: float | None) -> torch.Tensor:
    return _at(rows.q, rows.x)


def _ens_at(rows: Rows, alpha: float) -> torch.Tensor:
    return _at(rows.p, rows.x) * (1.0 - alpha) + _at(rows.q, rows.x) * alpha


def _mentored_at(rows: Rows, alpha: float) -> torch.Tensor:
    return _at(rows.p, rows.x) / (1.0 - alpha)


def _cactus_at(rows: Rows, delta: float) -> torch.Tensor:
    return cactus_h(_at(rows.p, rows.x), delta)


def _r_fuzzy_at(rows: Rows, tau: float) -> torch.Tensor:
    return torch.where(_r_fuzzy_uses_q(rows, tau), _at(rows.q, rows.x), _at(rows.p, rows.x))


def _casc_opt_at(rows: Rows, alpha: float) -> torch.Tensor:
    return torch.where(_casc_opt_uses_q(rows, alpha), _at(rows.q, rows.x), _at(rows.p, rows.x))


def _casc_tok_at(rows: Rows, alpha: float) -> torch.Tensor:
    if alpha < 0:
        return _at(rows.p, rows.x)
    in_a = _casc_tok_set(rows, alpha)
    eta = (1.0 - torch.linalg.vecdot(rows.q, in_a)).clamp_min_(0.0)
    return _at(rows.q, rows.x) * _at(in_a, rows.x) + eta * _at(rows.p, rows.x)


def _cont_dec_at(rows: Rows, beta: float) -> torch.Tensor:
    if beta == 0.0:
        return _at(rows.p, rows.x)
    s = _cont_dec_scores(rows, beta)
    return (_at(s, rows.x) - s.logsumexp(-1)).exp()


def _threshold_at(rows: Rows, t) -> torch.Tensor:
    return _threshold_rej(_at(rows.p, rows.x), t)
