"""The registry of relaxed verification methods: each method's rule, knob,
valid range, strict point, paper grid and what it needs from the backends.

The rules themselves (pure functions on probability rows) live in
``relaxtune.decoding.rules``; source of every rule and value: Xia, Ribar and Balanca,
"A Practical Investigation of Training-free Relaxed Speculative Decoding"
(arXiv 2607.08690, 2026), the unified table reproduced in
``shared/docs/relaxed-methods.md``. Beside them, the rules serving engines ship
(``relaxtune.decoding.engine_rules``: ``typical``, ``ears``) and SGLang's own
(``sglang_threshold``), each with its source in its docstring.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

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
    spec_casc_opt,
    spec_casc_tok,
    spec_cont_dec,
    strict,
)
from .engine_rules import _ears_at, _typical_at, ears, typical
from .fly import FLY_DEFAULT_TOP_K, FLY_RULE, FLY_THRESHOLD, FLY_TOP_K, FLY_WINDOW, fly
from .knobs import Knob, KnobValues, check_knob_values
from .trtllm import TRT_DELTA, TRT_PRESET_TOPK, TRT_TOPK, TRTLLM_RULE, trtllm_relaxed

__all__ = [
    "Rows",
    "Targets",
    "Needs",
    "MethodSpec",
    "Knob",
    "METHODS",
    "ENGINE_METHODS",
    "get_method",
    "js_divergence",
]


class Needs(enum.Flag):
    """What a method needs from the backends beyond ``p(x)`` and ``q(x)``."""

    NONE = 0
    FULL_ROWS = enum.auto()  # full p and q rows at every drafted position
    VERIFIER_LOGITS = enum.auto()  # raw verifier logits z_p
    DRAFTER_LOGITS = enum.auto()  # raw drafter logits z_q
    EXTRA_DRAFTER_STEP = enum.auto()  # drafter row at position N+1 after a full accept
    GREEDY_DRAFTS = enum.auto()  # drafts are the drafter's argmax and q rows are one-hot
    VERIFIER_ROWS = enum.auto()  # the full p row at every drafted position (its entropy or maximum), not q's
    ROUND_STATE = enum.auto()  # per-sequence state carried across rounds (``verify_rounds(state=...)``)


@dataclass(frozen=True)
class MethodSpec:
    """A method's contract.

    Attributes:
        id: method id (``METHODS`` key).
        targets: ``(Rows, knob) -> Targets`` over full rows.
        rej_at: ``(Rows, knob) -> pi_rej(x)`` ``[...]``, the accept test's input,
            computed without building full target rows (equal to gathering
            ``targets(...).pi_rej`` at x).
        knob: the knob's name in the paper (``None`` for knob-less methods); the
            tuner calls it alpha.
        low, high: the valid knob range; ``high_open`` excludes ``high``.
        strict_point: the knob value that gives strict sampling exactly (None
            when no value does).
        grid: the paper's grid, as knob values.
        search: ``(low, high, log)`` range for the tuner.
        needs: what the backends must supply.
        bonus_from_pi: draw the bonus token from the method's pi at N+1
            (``spec_cont_dec``) instead of ``p``.
        strict_below_zero: every negative knob is strict too (an empty switch set).
        refuses_greedy: T = 0 makes the method collapse to strict (or to greedy
            decoding: ``typical``).
        weaker_up: a larger knob relaxes less (``typical``'s epsilon), so the tuner's
            strength runs from the top of the search range.
        server_native: SGLang's speculative server runs the rule itself (a backend
            with such a server, ``native``, serves it there).
        description: one line for listings.
        knobs: the named knobs (``relaxtune.decoding.knobs.Knob``), each under its
            engine's own name. Empty for knob-less methods; for a one-knob method
            left empty, derived from ``knob``/``low``/``high``/``strict_point``/``search``.
        from_alpha: the single-knob view: ``alpha -> {name: value}`` for every named
            knob (default: the one knob takes alpha). ``knob``, ``low``, ``high``,
            ``strict_point``, ``grid`` and ``search`` describe alpha.
        strict_when_any: the method is strict as soon as ONE named knob is at its
            strict value (FLy's threshold, TensorRT-LLM's top-k or delta); otherwise
            all must be (SGLang's two thresholds).
        round_rule: a round-level hook (``relaxtune.decoding.round.RoundContext ->
            [B, N] bool`` accept verdicts, plus optional state handling) for rules
            whose verdict at one position reads later positions or state carried
            across rounds; None for per-position rules (the round's own test).
        refuses_sampling: greedy-only rule: T > 0 is refused (TensorRT-LLM).
        engine: which engine ships the rule, at which version and under which
            switch, or "no engine ships this" (one line).
    """

    id: str
    targets: Callable[..., Targets]
    rej_at: Callable[..., torch.Tensor]
    knob: str | None
    low: float = 0.0
    high: float = 0.0
    high_open: bool = False
    strict_point: float | None = None
    grid: tuple[float, ...] = ()
    search: tuple[float, float, bool] | None = None
    needs: Needs = Needs.NONE
    bonus_from_pi: bool = False
    strict_below_zero: bool = False
    refuses_greedy: bool = False
    server_native: bool = False
    weaker_up: bool = False
    description: str = ""
    knobs: tuple[Knob, ...] = ()
    from_alpha: Callable[[float], dict[str, Any]] | None = None
    strict_when_any: bool = False
    round_rule: Any = None
    refuses_sampling: bool = False
    engine: str = ""

    def __post_init__(self) -> None:
        if not self.knobs and self.knob is not None:  # one-knob method: its knob is alpha itself
            lo, hi, log = self.search if self.search else (self.low, self.high, False)
            object.__setattr__(self, "knobs", (Knob(
                self.knob, "float", self.low, self.high, self.high_open, self.strict_point, log, (lo, hi),
            ),))

    @property
    def pointwise(self) -> bool:
        """True when the accept test reads only p(x) and q(x) (full rows are then
        needed only at the rejected position)."""
        return not self.needs & (Needs.FULL_ROWS | Needs.VERIFIER_ROWS)

    @property
    def has_knob(self) -> bool:
        """False for ``strict`` and ``always_accept``."""
        return self.knob is not None

    @property
    def knob_names(self) -> tuple[str, ...]:
        """The named knobs' names, in declared order (empty for knob-less methods)."""
        return tuple(k.name for k in self.knobs)

    def named(self, knob: float | KnobValues | None) -> dict[str, Any] | None:
        """The named knob values for the alpha view (a number) or a mapping, validated.

        Returns:
            ``{name: value}`` (None for knob-less methods).

        Raises:
            ValueError: as ``check_knob``.
        """
        value = self.check_knob(knob)
        if value is None or isinstance(value, dict):
            return value
        named = self.from_alpha(value) if self.from_alpha else {self.knobs[0].name: value}
        return check_knob_values(self.knobs, named, self.id)

    def check_knob(self, knob: float | KnobValues | None) -> float | dict[str, Any] | None:
        """Validate a knob value and return it as a float (None for knob-less methods);
        a mapping of named knobs is validated knob by knob and returned as a dict.

        Raises:
            ValueError: knob missing, given to a knob-less method, NaN, or outside
                ``[low, high]`` (``[low, high)`` when ``high_open``); for a mapping,
                a missing or unknown name or a value outside its knob's range.
        """
        if isinstance(knob, Mapping):
            if not self.has_knob:
                raise ValueError(f"method {self.id!r} has no knob, got {dict(knob)!r}")
            return check_knob_values(self.knobs, knob, self.id)
        if not self.has_knob:
            if knob is not None:
                raise ValueError(f"method {self.id!r} has no knob, got {knob!r}")
            return None
        if knob is None:
            raise ValueError(f"method {self.id!r} needs its knob {self.knob!r} (alpha)")
        value = float(knob)
        if self.strict_point is not None and value == self.strict_point:
            return value
        upper_ok = value < self.high if self.high_open or math.isinf(self.high) else value <= self.high
        if math.isnan(value) or value < self.low or not upper_ok:
            close = ")" if self.high_open or math.isinf(self.high) else "]"
            raise ValueError(
                f"{self.knob} = {knob!r} is outside the valid range of {self.id!r}: "
                f"[{self.low}, {self.high}{close}"
            )
        return value

    def check_temperature(self, temperature: float | None) -> None:
        """Refuse T = 0 for methods that collapse to strict under greedy sampling, and
        T > 0 for greedy-only rules.

        Raises:
            ValueError: naming the reason.
        """
        if self.refuses_sampling and temperature is not None and temperature > 0:
            raise ValueError(
                f"method {self.id!r} is greedy-only as its engine runs it ({self.engine}): it ignores the "
                "temperature and emits the verifier's argmax, so measure it at temperature 0"
            )
        if temperature == 0.0 and self.refuses_greedy:
            raise ValueError(
                f"method {self.id!r} collapses to strict at temperature 0: the verifier row is "
                f"one-hot, so {self.knob} changes nothing and tuning it only burns compute; "
                "use temperature > 0 or a method that mixes in q (ens, r_fuzzy, spec_casc_*)"
            )

    def is_strict(self, knob: float | KnobValues | None) -> bool:
        """True when ``knob`` (alpha, or a mapping of named knobs) is a value at which
        the method is exactly strict."""
        if self.id == "strict":
            return True
        if knob is None:
            return False
        if isinstance(knob, Mapping) and len(self.knobs) == 1:  # the one knob is alpha
            knob = knob.get(self.knobs[0].name)
            if knob is None:
                return False
        if not isinstance(knob, Mapping):
            if self.strict_point is None:
                return False
            return knob == self.strict_point or (self.strict_below_zero and knob < 0)
        at = [k.strict is not None and knob.get(k.name) == k.strict for k in self.knobs]
        return any(at) if self.strict_when_any else bool(at) and all(at)


_INF = float("inf")
_LN2 = math.log(2.0)

METHODS: dict[str, MethodSpec] = {
    spec.id: spec
    for spec in (
        MethodSpec(
            "strict", strict, _strict_at, None,
            engine="every engine (lossless): vLLM standard, SGLang at thresholds 1, transformers assisted "
                   "generation without an ensemble weight",
            description="Leviathan/Chen speculative sampling (lossless)",
        ),
        MethodSpec(
            "always_accept", always_accept, _always_at, None,
            engine="no engine ships this",
            description="accept every draft; bonus from p (upper bound on acceptance)",
        ),
        MethodSpec(
            "ens", ens, _ens_at, "alpha", 0.0, 1.0, strict_point=0.0, grid=(0.05, 0.1, 0.2),
            search=(0.0, 0.5, False),
            engine="transformers 5.14.0+: generate(assistant_model=..., assistant_ensemble_weight=1 - alpha, do_sample=True) "
                   "(generation/utils.py _speculative_sampling; alpha = 0: no ensemble); sampling path only",
            description="ensemble pi = (1-alpha) p + alpha q (alpha = 1 - verifier weight w)",
        ),
        MethodSpec(
            "mentored", mentored, _mentored_at, "alpha", 0.0, 1.0, high_open=True, strict_point=0.0,
            grid=(0.3, 0.7, 0.95), search=(0.0, 0.99, False), refuses_greedy=True,
            engine="no engine ships this",
            description="accept w.p. min(1, p(x)/((1-alpha) q(x))), residual from p",
        ),
        MethodSpec(
            "cactus", cactus, _cactus_at, "delta", 0.0, _INF, strict_point=0.0, grid=(0.1, 0.25, 1.0, 10.0),
            search=(0.01, 100.0, True), refuses_greedy=True,
            engine="no engine ships this",
            description="boost p(x) to min(1, p + sqrt(2 delta p (1-p))); verifier-anchored",
        ),
        MethodSpec(
            "r_fuzzy", r_fuzzy, _r_fuzzy_at, "tau", -_INF, _LN2, strict_point=-_INF, grid=(0.05, 0.2, 0.3),
            search=(0.01, _LN2, True), needs=Needs.FULL_ROWS, strict_below_zero=True,
            engine="no engine ships this",
            description="use q where JS(p, q) <= tau nats, else p",
        ),
        MethodSpec(
            "spec_casc_opt", spec_casc_opt, _casc_opt_at, "alpha", -_INF, 1.0, strict_point=-_INF,
            grid=(-0.1, 0.0, 0.05), search=(-0.5, 0.5, False), needs=Needs.FULL_ROWS,
            engine="no engine ships this",
            description="use q where max q >= max p - alpha TV(p, q) (alpha = 0 is not strict)",
        ),
        MethodSpec(
            "spec_casc_tok", spec_casc_tok, _casc_tok_at, "alpha", -_INF, 1.0, strict_point=-_INF,
            grid=(0.0, 0.35, 0.8), search=(0.0, 1.0, False), strict_below_zero=True,
            needs=Needs.FULL_ROWS | Needs.VERIFIER_LOGITS,
            engine="no engine ships this",
            description="q on the verifier's near-argmax set A, p elsewhere (alpha = 0 is not strict)",
        ),
        MethodSpec(
            "spec_cont_dec", spec_cont_dec, _cont_dec_at, "beta", 0.0, _INF, strict_point=0.0, grid=(0.1, 0.5, 1.0),
            search=(0.01, 2.0, True),
            needs=Needs.FULL_ROWS | Needs.DRAFTER_LOGITS | Needs.EXTRA_DRAFTER_STEP,
            bonus_from_pi=True, refuses_greedy=True,
            engine="no engine ships this",
            description="contrastive pi = softmax_G(((1+beta) z_p - beta z_q)/T), bonus from pi",
        ),
        MethodSpec(
            "sglang_threshold", sglang_threshold, _threshold_at, "threshold", 0.0, 1.0, strict_point=1.0,
            grid=(0.8, 0.5, 0.2), search=(0.05, 1.0, False), needs=Needs.GREEDY_DRAFTS, refuses_greedy=True,
            server_native=True,
            knobs=(
                Knob("speculative_accept_threshold_single", "float", 0.0, 1.0, strict=1.0, search=(0.05, 1.0),
                     default=1.0, doc="accept outright when p(x) >= this"),
                Knob("speculative_accept_threshold_acc", "float", 0.0, 1.0, strict=1.0, search=(0.05, 1.0),
                     default=1.0, doc="else accept with probability min(1, p(x) / this)"),
            ),
            from_alpha=lambda t: {"speculative_accept_threshold_single": t, "speculative_accept_threshold_acc": t},
            engine="SGLang 0.5.23 (since 0.4.x): --speculative-accept-threshold-single / -acc, CUDA, non-greedy "
                   "rows, server-wide (POST /set_internal_state); sampling.cuh TreeSpeculativeSamplingTargetOnly",
            description="SGLang's built-in rule: greedy drafts, accept if p(x) >= t_single or u < p(x)/t_acc "
                        "(alpha ties both to t; not in the paper)",
        ),
        MethodSpec(
            "typical", typical, _typical_at, "epsilon", 0.0, 1.0, strict_point=None, grid=(0.25, 0.09, 0.03),
            search=(0.01, 1.0, True), needs=Needs.VERIFIER_ROWS, refuses_greedy=True, weaker_up=True,
            engine="no engine ships this: vLLM's TypicalAcceptanceSampler (PR #5131, V0 spec decode) left with the V0 "
                   "engine; vLLM 0.33.0's rejection_sample_method is standard|synthetic|block|fly",
            description="typical acceptance (Medusa; vLLM V0 only): accept iff p(x) > min(eps, sqrt(eps) e^-H(p)), "
                        "else the verifier's argmax; deterministic, no strict point (not in the paper)",
        ),
        MethodSpec(
            "ears", ears, _ears_at, "tolerance", 0.0, 1.0, strict_point=0.0, grid=(0.1, 0.3, 0.5),
            search=(0.0, 1.0, False), needs=Needs.VERIFIER_ROWS, refuses_greedy=True,
            engine="no engine ships this formula (vllm-ascend PRs #5587/#7845 closed unmerged); vllm-ascend "
                   "0.23.0.post1 ships entropy verify (enable_entropy_verify), "
                   "a different rule (accept iff p/q >= min(exp(-alpha H), threshold) u)",
            description="EARS: accept w.p. min(1, p(x)/q(x) + t (1 - max p)), never p(x) = 0; residual from p "
                        "(not in the paper)",
        ),
    )
}


# The serving engines' own round-level rules (several named knobs, a round-level hook),
# kept out of ``METHODS`` until the search, records and export take named knobs
# (schema v3): ``get_method`` resolves them, listings and ``--methods`` do not.
ENGINE_METHODS: dict[str, MethodSpec] = {
    spec.id: spec
    for spec in (
        MethodSpec(
            "fly", fly, _strict_at, FLY_THRESHOLD, 0.0, _INF, strict_point=_INF, grid=(0.9, 0.6, 0.3),
            search=(0.0, 1.1, False), needs=Needs.VERIFIER_ROWS, weaker_up=True,
            knobs=(
                Knob(FLY_WINDOW, "int", 1, _INF, derived="min(6, N - 1)",
                     doc="look-ahead window W: the next W drafts must be natively accepted (< N)"),
                Knob(FLY_THRESHOLD, "float", 0.0, _INF, strict=_INF, search=(0.0, 1.1), default=0.3,
                     doc="defer a rejection when the top-k entropy (nats) is at least this"),
                Knob(FLY_TOP_K, "int", 1, _INF, search=(1, 20), default=FLY_DEFAULT_TOP_K,
                     doc="entropy over the verifier's k most probable tokens (not renormalised)"),
            ),
            from_alpha=lambda a: {FLY_WINDOW: None, FLY_THRESHOLD: a, FLY_TOP_K: FLY_DEFAULT_TOP_K},
            strict_when_any=True, round_rule=FLY_RULE,
            engine="vLLM 0.33.0+: --speculative-config rejection_sample_method \"fly\" (vllm/v1/spec_decode/fly.py); "
                   "N >= 2, fly_window_size < N; greedy and sampled requests",
            description="vLLM FLy: flip a native rejection whose top-k entropy >= threshold when the next W drafts "
                        "are natively accepted (alpha = fly_entropy_threshold; W = min(6, N-1), k = 3)",
        ),
        MethodSpec(
            "trtllm_relaxed", trtllm_relaxed, _strict_at, TRT_DELTA, 0.0, _INF, strict_point=0.0,
            grid=(0.01, 0.1, 0.6), search=(0.0, 1.0, False),
            needs=Needs.VERIFIER_LOGITS | Needs.ROUND_STATE, refuses_sampling=True,
            knobs=(
                Knob(TRT_TOPK, "int", 1, _INF, strict=1, search=(1, 20), default=1,
                     doc="candidates: the verifier's k most probable tokens"),
                Knob(TRT_DELTA, "float", 0.0, _INF, strict=0.0, search=(0.0, 1.0), default=0.0,
                     doc="keep candidates with probability >= top-1 probability - delta (inside thinking)"),
            ),
            from_alpha=lambda d: {TRT_TOPK: TRT_PRESET_TOPK, TRT_DELTA: d},
            strict_when_any=True, round_rule=TRTLLM_RULE,
            engine="TensorRT-LLM 0.20.0+ (by date): MTPDecodingConfig use_relaxed_acceptance_for_thinking, "
                   "relaxed_topk, relaxed_delta (mtpKernels.cu mtpRelaxedAcceptanceKernel); MTP heads, greedy-only, "
                   "between the thinking tokens",
            description="TensorRT-LLM relaxed MTP acceptance: inside thinking accept a draft among the top-k raw "
                        "probabilities >= top-1 - delta, else strict greedy (alpha = relaxed_delta, relaxed_topk 10)",
        ),
    )
}


def get_method(method: str | MethodSpec) -> MethodSpec:
    """Look up a method by id (``METHODS``, then ``ENGINE_METHODS``).

    Raises:
        ValueError: for an unknown id, listing the known ones.
    """
    if isinstance(method, MethodSpec):
        return method
    spec = METHODS.get(method) or ENGINE_METHODS.get(method)
    if spec is None:
        known = ", ".join([*METHODS, *ENGINE_METHODS])
        raise ValueError(f"unknown method {method!r}; known methods: {known}")
    return spec
