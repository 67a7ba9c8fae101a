"""The registry of relaxed verification methods: each method's rule, knob,
valid range, strict point, paper grid and what it needs from the backends.

The rules themselves (pure functions on probability rows) live in
``relaxtune.decoding.rules``; source of every rule and value: Xia, Ribar and Balanca,
"A Practical Investigation of Training-free Relaxed Speculative Decoding"
(arXiv 2607.08690, 2026), the unified table reproduced in
``docs/concepts/relaxed-rules.md``. Beside them, the rules serving engines ship
(``relaxtune.decoding.engine_rules``: ``typical``, ``ears``, re-audited: no engine
ships either) and SGLang's own (``sglang_threshold``, two named knobs), each with
its source in its docstring and its ``engine`` label. The contract is
``relaxtune.decoding.spec.MethodSpec``; the engines' round-level rules (vLLM's FLy,
TensorRT-LLM's relaxed MTP acceptance) are ``ENGINE_METHODS``
(``relaxtune.decoding.engine_methods``), which ``get_method`` also resolves.
"""

from __future__ import annotations

import math

from .engine_methods import ENGINE_METHODS
from .engine_rules import _ears_at, _typical_at, ears, typical
from .knobs import Knob
from .rules import (
    Rows,
    Targets,
    _always_at,
    _cactus_at,
    _casc_opt_at,
    _casc_tok_at,
    _cont_dec_at,
    _ens_at,
    _mentored_at,
    _r_fuzzy_at,
    _strict_at,
    _threshold_at,
    always_accept,
    cactus,
    ens,
    js_divergence,
    mentored,
    r_fuzzy,
    sglang_threshold,
    sglang_tied,
    spec_casc_opt,
    spec_casc_tok,
    spec_cont_dec,
    strict,
)
from .spec import MethodSpec, Needs

__all__ = [
    "Rows",
    "Targets",
    "Needs",
    "MethodSpec",
    "Knob",
    "METHODS",
    "ENGINE_METHODS",
    "ALL_METHODS",
    "get_method",
    "js_divergence",
]


_INF = float("inf")
_LN2 = math.log(2.0)

METHODS: dict[str, MethodSpec] = {
    spec.id: spec
    for spec in (
        MethodSpec(
            "strict",
            strict,
            _strict_at,
            None,
            engine="every engine (lossless): vLLM standard, SGLang at thresholds 1, transformers assisted "
            "generation without an ensemble weight",
            description="Leviathan/Chen speculative sampling (lossless)",
        ),
        MethodSpec(
            "always_accept",
            always_accept,
            _always_at,
            None,
            engine="no engine ships this",
            description="accept every draft; bonus from p (upper bound on acceptance)",
        ),
        MethodSpec(
            "ens",
            ens,
            _ens_at,
            "alpha",
            0.0,
            1.0,
            strict_point=0.0,
            grid=(0.05, 0.1, 0.2),
            search=(0.0, 0.5, False),
            engine="transformers 5.14.0+: generate(assistant_model=..., assistant_ensemble_weight=1 - alpha, "
            "do_sample=True) (generation/utils.py _speculative_sampling; alpha = 0: no ensemble); "
            "sampling path only",
            description="ensemble pi = (1-alpha) p + alpha q (alpha = 1 - verifier weight w)",
        ),
        MethodSpec(
            "mentored",
            mentored,
            _mentored_at,
            "alpha",
            0.0,
            1.0,
            high_open=True,
            strict_point=0.0,
            grid=(0.3, 0.7, 0.95),
            search=(0.0, 0.99, False),
            refuses_greedy=True,
            engine="no engine ships this",
            description="accept w.p. min(1, p(x)/((1-alpha) q(x))), residual from p",
        ),
        MethodSpec(
            "cactus",
            cactus,
            _cactus_at,
            "delta",
            0.0,
            _INF,
            strict_point=0.0,
            grid=(0.1, 0.25, 1.0, 10.0),
            search=(0.01, 100.0, True),
            refuses_greedy=True,
            engine="no engine ships this",
            description="boost p(x) to min(1, p + sqrt(2 delta p (1-p))); verifier-anchored",
        ),
        MethodSpec(
            "r_fuzzy",
            r_fuzzy,
            _r_fuzzy_at,
            "tau",
            -_INF,
            _LN2,
            strict_point=-_INF,
            grid=(0.05, 0.2, 0.3),
            search=(0.01, _LN2, True),
            needs=Needs.FULL_ROWS,
            strict_below_zero=True,
            engine="no engine ships this",
            description="use q where JS(p, q) <= tau nats, else p",
        ),
        MethodSpec(
            "spec_casc_opt",
            spec_casc_opt,
            _casc_opt_at,
            "alpha",
            -_INF,
            1.0,
            strict_point=-_INF,
            grid=(-0.1, 0.0, 0.05),
            search=(-0.5, 0.5, False),
            needs=Needs.FULL_ROWS,
            engine="no engine ships this",
            description="use q where max q >= max p - alpha TV(p, q) (alpha = 0 is not strict)",
        ),
        MethodSpec(
            "spec_casc_tok",
            spec_casc_tok,
            _casc_tok_at,
            "alpha",
            -_INF,
            1.0,
            strict_point=-_INF,
            grid=(0.0, 0.35, 0.8),
            search=(0.0, 1.0, False),
            strict_below_zero=True,
            needs=Needs.FULL_ROWS | Needs.VERIFIER_LOGITS,
            engine="no engine ships this",
            description="q on the verifier's near-argmax set A, p elsewhere (alpha = 0 is not strict)",
        ),
        MethodSpec(
            "spec_cont_dec",
            spec_cont_dec,
            _cont_dec_at,
            "beta",
            0.0,
            _INF,
            strict_point=0.0,
            grid=(0.1, 0.5, 1.0),
            search=(0.01, 2.0, True),
            needs=Needs.FULL_ROWS | Needs.DRAFTER_LOGITS | Needs.EXTRA_DRAFTER_STEP,
            bonus_from_pi=True,
            refuses_greedy=True,
            engine="no engine ships this",
            description="contrastive pi = softmax_G(((1+beta) z_p - beta z_q)/T), bonus from pi",
        ),
        MethodSpec(
            "sglang_threshold",
            sglang_threshold,
            _threshold_at,
            "threshold",
            0.0,
            1.0,
            strict_point=1.0,
            grid=(0.8, 0.5, 0.2),
            search=(0.05, 1.0, False),
            needs=Needs.GREEDY_DRAFTS,
            refuses_greedy=True,
            server_native=True,
            knobs=(
                Knob(
                    "speculative_accept_threshold_single",
                    "float",
                    0.0,
                    1.0,
                    strict=1.0,
                    search=(0.05, 1.0),
                    default=1.0,
                    weaker_up=True,
                    doc="accept outright when p(x) >= this (any value >= the acc threshold is the tied rule)",
                ),
                Knob(
                    "speculative_accept_threshold_acc",
                    "float",
                    0.0,
                    1.0,
                    strict=1.0,
                    search=(0.05, 1.0),
                    default=1.0,
                    weaker_up=True,
                    doc="else accept with probability min(1, p(x) / this)",
                ),
            ),
            from_alpha=lambda t: {"speculative_accept_threshold_single": t, "speculative_accept_threshold_acc": t},
            primary="speculative_accept_threshold_acc",
            canonical=sglang_tied,
            engine="SGLang 0.5.23 (since 0.4.x): --speculative-accept-threshold-single / -acc, CUDA, non-greedy "
            "rows, server-wide (POST /set_internal_state); sampling.cuh TreeSpeculativeSamplingTargetOnly",
            description="SGLang's built-in rule: greedy drafts, accept if p(x) >= t_single or u < p(x)/t_acc "
            "(alpha is t_acc, t_single searched beside it, tied to alpha in the paper-style grid; not in the paper)",
        ),
        MethodSpec(
            "typical",
            typical,
            _typical_at,
            "epsilon",
            0.0,
            1.0,
            strict_point=None,
            grid=(0.25, 0.09, 0.03),
            search=(0.01, 1.0, True),
            needs=Needs.VERIFIER_ROWS,
            refuses_greedy=True,
            weaker_up=True,
            engine="no engine ships this: vLLM's TypicalAcceptanceSampler (PR #5131, V0 spec decode) left with the V0 "
            "engine; vLLM 0.33.0's rejection_sample_method is standard|synthetic|block|fly",
            description="typical acceptance (Medusa; vLLM V0 only): accept iff p(x) > min(eps, sqrt(eps) e^-H(p)), "
            "else the verifier's argmax; deterministic, no strict point (not in the paper)",
        ),
        MethodSpec(
            "ears",
            ears,
            _ears_at,
            "tolerance",
            0.0,
            1.0,
            strict_point=0.0,
            grid=(0.1, 0.3, 0.5),
            search=(0.0, 1.0, False),
            needs=Needs.VERIFIER_ROWS,
            refuses_greedy=True,
            engine="no engine ships this formula (vllm-ascend PRs #5587/#7845 closed unmerged); vllm-ascend "
            "0.23.0.post1 ships entropy verify (enable_entropy_verify), "
            "a different rule (accept iff p/q >= min(exp(-alpha H), threshold) u)",
            description="EARS: accept w.p. min(1, p(x)/q(x) + t (1 - max p)), never p(x) = 0; residual from p "
            "(not in the paper)",
        ),
    )
}


# Every method a job can tune, list and export: the per-position rules, then the engines'
# round-level ones (``relaxtune methods`` lists these, ``--methods`` takes any of them).
ALL_METHODS: dict[str, MethodSpec] = METHODS | ENGINE_METHODS


def get_method(method: str | MethodSpec) -> MethodSpec:
    """Look up a method by id (``ALL_METHODS``: ``METHODS``, then ``ENGINE_METHODS``).

    Raises:
        ValueError: for an unknown id, listing the known ones.
    """
    if isinstance(method, MethodSpec):
        return method
    spec = ALL_METHODS.get(method)
    if spec is None:
        known = ", ".join(ALL_METHODS)
        raise ValueError(f"unknown method {method!r}; known methods: {known}")
    return spec
