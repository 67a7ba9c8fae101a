"""The serving engines' own round-level rules as methods: vLLM's FLy (``fly``) and
TensorRT-LLM's relaxed MTP acceptance (``trtllm_relaxed``), each with its knobs
under the engine's own names, its strict point and its round-level hook. The rules
are in ``relaxtune.decoding.fly`` and ``relaxtune.decoding.trtllm``, sources in
their docstrings.
"""

from __future__ import annotations

from .fly import FLY_DEFAULT_TOP_K, FLY_MAX_DEFAULT_WINDOW, FLY_RULE, FLY_THRESHOLD, FLY_TOP_K, FLY_WINDOW, fly
from .knobs import Knob
from .rules import _strict_at
from .spec import MethodSpec, Needs
from .trtllm import TRT_DELTA, TRT_PRESET_TOPK, TRT_TOPK, TRTLLM_RULE, trtllm_relaxed

__all__ = ["ENGINE_METHODS"]

_INF = float("inf")

# The serving engines' own round-level rules (several named knobs, a round-level hook):
# a registry of their own beside ``METHODS`` (whose rules are per position), joined in
# ``relaxtune.decoding.methods.ALL_METHODS``, which ``get_method``, ``relaxtune methods``
# and ``--methods`` use.
ENGINE_METHODS: dict[str, MethodSpec] = {
    spec.id: spec
    for spec in (
        MethodSpec(
            "fly",
            fly,
            _strict_at,
            FLY_THRESHOLD,
            0.0,
            _INF,
            strict_point=_INF,
            grid=(0.9, 0.6, 0.3),
            search=(0.0, 1.1, False),
            needs=Needs.VERIFIER_ROWS,
            weaker_up=True,
            knobs=(
                Knob(
                    FLY_WINDOW,
                    "int",
                    1,
                    _INF,
                    derived="min(6, N - 1)",
                    derive=lambda n: min(FLY_MAX_DEFAULT_WINDOW, n - 1),
                    weaker_up=True,
                    below_n=True,
                    doc="look-ahead window W: the next W drafts must be natively accepted (< N)",
                ),
                Knob(
                    FLY_THRESHOLD,
                    "float",
                    0.0,
                    _INF,
                    strict=_INF,
                    search=(0.0, 1.1),
                    default=0.3,
                    doc="defer a rejection when the top-k entropy (nats) is at least this",
                ),
                Knob(
                    FLY_TOP_K,
                    "int",
                    1,
                    _INF,
                    search=(1, 20),
                    default=FLY_DEFAULT_TOP_K,
                    doc="entropy over the verifier's k most probable tokens (not renormalised)",
                ),
            ),
            from_alpha=lambda a: {FLY_WINDOW: None, FLY_THRESHOLD: a, FLY_TOP_K: FLY_DEFAULT_TOP_K},
            primary=FLY_THRESHOLD,
            strict_when_any=True,
            round_rule=FLY_RULE,
            engine='vLLM 0.33.0+: --speculative-config rejection_sample_method "fly" (vllm/v1/spec_decode/fly.py); '
            "N >= 2, fly_window_size < N; greedy and sampled requests",
            description="vLLM FLy: flip a native rejection whose top-k entropy >= threshold when the next W drafts "
            "are natively accepted (alpha = fly_entropy_threshold; W < N and k searched beside it, the grid at "
            "W = min(6, N-1), k = 3)",
        ),
        MethodSpec(
            "trtllm_relaxed",
            trtllm_relaxed,
            _strict_at,
            TRT_DELTA,
            0.0,
            _INF,
            strict_point=0.0,
            grid=(0.01, 0.1, 0.6),
            search=(0.0, 1.0, False),
            needs=Needs.VERIFIER_LOGITS | Needs.ROUND_STATE,
            refuses_sampling=True,
            knobs=(
                Knob(
                    TRT_TOPK,
                    "int",
                    1,
                    _INF,
                    strict=1,
                    search=(1, 20),
                    default=1,
                    doc="candidates: the verifier's k most probable tokens",
                ),
                Knob(
                    TRT_DELTA,
                    "float",
                    0.0,
                    _INF,
                    strict=0.0,
                    search=(0.0, 1.0),
                    default=0.0,
                    doc="keep candidates with probability >= top-1 probability - delta (inside thinking)",
                ),
            ),
            from_alpha=lambda d: {TRT_TOPK: TRT_PRESET_TOPK, TRT_DELTA: d},
            primary=TRT_DELTA,
            strict_when_any=True,
            round_rule=TRTLLM_RULE,
            engine="TensorRT-LLM 0.20.0+ (by date): MTPDecodingConfig use_relaxed_acceptance_for_thinking, "
            "relaxed_topk, relaxed_delta (mtpKernels.cu mtpRelaxedAcceptanceKernel); MTP heads, greedy-only, "
            "between the thinking tokens",
            description="TensorRT-LLM relaxed MTP acceptance: inside thinking accept a draft among the top-k raw "
            "probabilities >= top-1 - delta, else strict greedy (alpha = relaxed_delta; relaxed_topk searched beside "
            "it, the grid at 10)",
        ),
    )
}
