"""Relaxed rules from the literature that serving engines have been said to ship,
re-audited against the engines' released code (late 2026), and the mapping of
relaxtune's ``ens`` onto transformers' static ensemble.

- ``typical``: typical acceptance (Medusa). vLLM shipped it only in its V0 engine
  (``TypicalAcceptanceSampler``, PR vllm-project/vllm#5131, 2024), removed with V0;
  vLLM 0.33.0's ``rejection_sample_method`` is ``standard|synthetic|block|fly``.
  No engine ships this today.
- ``ears``: EARS (Sun et al. 2025). The authors' vllm-ascend pull requests #5587 and
  #7845 were closed unmerged; the released vllm-ascend 0.23.0.post1 ships
  ``enable_entropy_verify``, a different formula (accept iff ``p/q >= min(exp(-alpha
  H), threshold) u``). No engine ships this formula.
- ``ens`` = transformers 5.14.0+ ``assistant_ensemble_weight`` at ``w = 1 - alpha``
  (``ensemble_weight``), sampling path only.

The engines' own rules live beside: SGLang's thresholds (``rules.sglang_threshold``),
vLLM's FLy (``fly``), TensorRT-LLM's relaxed MTP acceptance (``trtllm``).

Same contract as ``relaxtune.decoding.rules``: per drafted position, targets ``pi_rej`` (the
accept test ``u < pi_rej(x) / q(x)``) and ``pi_res`` (the residual
``norm((pi_res - q)+)``), plus a ``*_at`` form giving ``pi_rej(x)`` alone; the
bonus token comes from ``p``. Both read the verifier's whole row at every drafted
position (its entropy, its maximum), never the drafter's.

Shapes as in ``rules``: ``p``, ``q`` ``[..., V]`` after the sampling transform,
``x`` ``[...]``. Top-K rows (``-inf`` logits outside the returned ids, so ``p = 0``
there): each docstring says how the rule reads them; neither returns NaN on them.
"""

from __future__ import annotations

import math

import torch

from .rules import Rows, Targets, _at

__all__ = ["typical", "typical_threshold", "ears", "ears_slack", "TYPICAL_LOG_FLOOR", "ensemble_weight", "ens_alpha"]

TYPICAL_LOG_FLOOR = 1e-5  # inside the entropy's log, as Medusa and vLLM compute it


def typical_threshold(p: torch.Tensor, epsilon: float, delta: float | None = None) -> torch.Tensor:
    """Typical acceptance's threshold ``min(epsilon, delta exp(-H(p)))``, ``[..., V] -> [...]``.

    The entropy is computed as both sources compute it, ``H = -sum p log(p + 1e-5)``
    (Medusa's ``evaluate_posterior``, vLLM's ``TypicalAcceptanceSampler``); the floor
    lowers H on flat rows (by 0.26 nats on 30,000 equal entries). ``delta`` defaults
    to ``sqrt(epsilon)``, Medusa's recommendation (its defaults: 0.09 and 0.3).
    """
    d = math.sqrt(epsilon) if delta is None else float(delta)
    h = -torch.linalg.vecdot(p, (p + TYPICAL_LOG_FLOOR).log())
    return ((-h).exp() * d).clamp_max(epsilon)


def typical(rows: Rows, epsilon: float, delta: float | None = None) -> Targets:
    """Typical acceptance (Cai et al. 2024, "Medusa", section 3.3.1; vLLM V0's
    ``TypicalAcceptanceSampler``, gone from vLLM's current engine: no engine ships
    it): the draft ``x`` is accepted iff
    ``p(x) > min(epsilon, delta exp(-H(p)))`` (``typical_threshold``), a deterministic
    test; the first rejected position emits the verifier's argmax (vLLM's
    "recovered" token); after N accepts the bonus token comes from ``p``, as in
    every round (vLLM's bonus token is the target's sample too).

    In the generalised round: ``pi_rej = 1[p > threshold]`` (so the ratio
    ``pi_rej(x) / q(x)`` is ``1 / q(x) >= 1`` or 0 and ``u < ratio`` does not depend
    on u) and ``pi_res = e_a``, ``a = argmax p`` (``norm((e_a - q)+) = e_a``; when
    ``q = e_a`` the residual is empty and the round falls back to ``pi_res``).
    Randomness contract: the round still consumes its N + 1 uniforms; the accept
    uniforms and the residual's are read but change nothing, the bonus token is
    drawn with ``u_{N+1}`` as in ``strict``. So the draw count, and the common random
    numbers of paired runs, are unchanged. Argmax ties go to the lowest id
    (``torch.argmax``, as vLLM's).

    Closed form (one position, ``x ~ q``), with ``a(y) = 1[p(y) > threshold]``:
    acceptance ``beta = sum_y q(y) a(y)``, emitted
    ``P(y) = q(y) a(y) + (1 - beta) [y = argmax p]``. A token with ``p = 0`` is
    never emitted (the threshold is >= 0, the argmax has ``p > 0``).

    No strict point: ``epsilon = 0`` accepts every draft with ``p(x) > 0``, and a
    larger ``epsilon`` (the knob, ``delta = sqrt(epsilon)``) only narrows the
    accepted set; since ``exp(-H) <= max p``, the argmax passes while ``delta < 1``
    (up to the 1e-5 floor). At T = 0 (one-hot ``p``) it is greedy decoding,
    whatever the knob. Grid: epsilon in {0.25, 0.09, 0.03}: 0.09 (delta 0.3) is
    Medusa's and vLLM's default, 0.03 the value of vLLM's tests, 0.25 a stricter
    bracket. Top-K rows: ``H`` and the argmax over the returned ids (a zero adds 0
    to ``H``); exact when the transform's support lies inside them (``top_k <= K``).
    """
    accept = rows.p > typical_threshold(rows.p, epsilon, delta).unsqueeze(-1)
    pi_res = torch.zeros_like(rows.p).scatter_(-1, rows.p.argmax(-1, keepdim=True), 1.0)
    return Targets(accept.to(rows.p.dtype), pi_res)


def ears_slack(p: torch.Tensor, tolerance: float) -> torch.Tensor:
    """EARS' slack ``t (1 - max p)``, ``[..., V] -> [...]``: large where the verifier is unsure."""
    return (1.0 - p.amax(-1)) * tolerance


def ears(rows: Rows, tolerance: float) -> Targets:
    """Efficient Adaptive Rejection Sampling (Sun et al., "EARS", arXiv 2512.13194,
    2025): the accept test's uniform is lowered by ``t (1 - max p)``, a tolerance
    proportional to the verifier's uncertainty, so a draft is accepted w.p.
    ``min(1, p(x) / q(x) + t (1 - max p))``; the residual is strict's,
    ``norm((p - q)+)``. As in the authors' vLLM-Ascend change (pull requests 5587 and
    7845: ``u' = max(u - t (1 - max p), eps)``, accept iff ``p(x) / q(x) >= u'``), a
    draft with ``p(x) = 0`` is never accepted. Both pull requests were closed
    unmerged: no engine ships this formula (vllm-ascend's released entropy verify
    is another rule).

    In the generalised round: ``pi_rej = 1[p > 0] (p + s q)`` with
    ``s = t (1 - max p)`` (``ears_slack``), and ``pi_res = p``. Closed form (one
    position, ``x ~ q``), with ``r(y) = min(q(y), 1[p(y) > 0] (p(y) + s q(y)))``:
    acceptance ``beta = sum_y r(y)``, emitted
    ``P(y) = r(y) + (1 - beta) norm((p - q)+)(y)``.

    ``t = 0`` is strict, bit for bit; any ``t`` is strict where ``max p = 1`` (T = 0).
    Valid range [0, 1] (the authors' check). Grid: t in {0.1, 0.3, 0.5}: 0.3 is the
    value the authors ran; 0.1 and 0.5 bracket it. Top-K rows: ``max p`` is exact
    (the top-1 is returned), so is ``p(x)``; the residual spans the returned ids,
    as strict's.
    """
    if tolerance == 0.0:
        return Targets(rows.p, rows.p)
    s = ears_slack(rows.p, tolerance).unsqueeze(-1)
    pi_rej = torch.where(rows.p > 0, rows.p + s * rows.q, torch.zeros_like(rows.p))
    return Targets(pi_rej, rows.p)


# ------------------------------------------------------------ pi_rej at the draft


def _typical_at(rows: Rows, epsilon: float, delta: float | None = None) -> torch.Tensor:
    p_x = _at(rows.p, rows.x)
    return (p_x > typical_threshold(rows.p, epsilon, delta)).to(rows.p.dtype)


def _ears_at(rows: Rows, tolerance: float) -> torch.Tensor:
    p_x = _at(rows.p, rows.x)
    if tolerance == 0.0:
        return p_x
    return torch.where(p_x > 0, p_x + ears_slack(rows.p, tolerance) * _at(rows.q, rows.x), torch.zeros_like(p_x))


# ------------------------------------------------- transformers' static ensemble


def ensemble_weight(alpha: float) -> float | None:
    """transformers' ``assistant_ensemble_weight`` for relaxtune's ``ens`` at ``alpha``:
    ``w = 1 - alpha``; None (no ensemble: lossless assisted generation) at ``alpha = 0``.

    On the sampling path (``do_sample=True``) transformers 5.14.0+ runs
    ``generation/utils.py`` ``_speculative_sampling`` (5.24.0 :4444-4507): accept iff
    ``r <= 1 - w + w p(x)/q(x)`` (``r = torch.rand_like``), residual
    ``norm((p - q)+)``, bonus from ``p``: relaxtune's ``ens`` (whose test is ``u <``,
    equal but at the tie). One difference: when the residual is empty
    (``sum (p - q)+ <= finfo.tiny``) transformers samples ``p``, relaxtune (below 8
    float eps) samples ``pi = w p + (1 - w) q``; both happen only where ``p = q`` up
    to float error. transformers' greedy path (``do_sample=False``: the argmax of
    the mixture) is another rule.

    Raises:
        ValueError: ``alpha`` outside ``[0, 1)`` (transformers validates ``w`` in the
            open interval (0, 1); ``alpha = 1`` is ``always_accept``).
    """
    a = float(alpha)
    if not 0.0 <= a < 1.0:
        raise ValueError(
            f"ens alpha = {alpha!r} has no transformers equivalent: assistant_ensemble_weight = "
            "1 - alpha must lie in (0, 1)"
        )
    return None if a == 0.0 else 1.0 - a


def ens_alpha(weight: float | None) -> float:
    """relaxtune's ``ens`` alpha for transformers' ``assistant_ensemble_weight``
    (None: 0, lossless).

    Raises:
        ValueError: ``weight`` outside (0, 1).
    """
    if weight is None:
        return 0.0
    w = float(weight)
    if not 0.0 < w < 1.0:
        raise ValueError(f"assistant_ensemble_weight must lie in (0, 1) (transformers), got {weight!r}")
    return 1.0 - w
