"""The registry of relaxed verification methods: each method's rule, knob,
valid range, strict point, paper grid and what it needs from the backends.

The rules themselves (pure functions on probability rows) live in
``relaxtune.decoding.rules``; source of every rule and value: Xia, Ribar and Balanca,
"A Practical Investigation of Training-free Relaxed Speculative Decoding"
(arXiv 2607.08690, 2026), the unified table reproduced in
``docs/concepts/relaxed-rules.md``. Beside them, the rules serving engines ship
(``relaxtune.decoding.engine_rules``: ``typical``, ``ears``) and SGLang's own
(``sglang_threshold``), each with its source in its docstring.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable

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

__all__ = [
    "Rows",
    "Targets",
    "Needs",
    "MethodSpec",
    "METHODS",
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

    @property
    def pointwise(self) -> bool:
        """True when the accept test reads only p(x) and q(x) (full rows are then
        needed only at the rejected position)."""
        return not self.needs & (Needs.FULL_ROWS | Needs.VERIFIER_ROWS)

    @property
    def has_knob(self) -> bool:
        """False for ``strict`` and ``always_accept``."""
        return self.knob is not None

    def check_knob(self, knob: float | None) -> float | None:
        """Validate a knob value and return it as a float (None for knob-less methods).

        Raises:
            ValueError: knob missing, given to a knob-less method, NaN, or outside
                ``[low, high]`` (``[low, high)`` when ``high_open``).
        """
        if not self.has_knob:
            if knob is not None:
                raise ValueError(f"method {self.id!r} has no knob, got {knob!r}")
            return None
        if knob is None:
            raise ValueError(f"method {self.id!r} needs its knob {self.knob!r} (alpha)")
        value = float(knob)
        upper_ok = value < self.high if self.high_open or math.isinf(self.high) else value <= self.high
        if math.isnan(value) or value < self.low or not upper_ok:
            close = ")" if self.high_open or math.isinf(self.high) else "]"
            raise ValueError(
                f"{self.knob} = {knob!r} is outside the valid range of {self.id!r}: "
                f"[{self.low}, {self.high}{close}"
            )
        return value

    def check_temperature(self, temperature: float | None) -> None:
        """Refuse T = 0 for methods that collapse to strict under greedy sampling.

        Raises:
            ValueError: naming the reason.
        """
        if temperature == 0.0 and self.refuses_greedy:
            raise ValueError(
                f"method {self.id!r} collapses to strict at temperature 0: the verifier row is "
                f"one-hot, so {self.knob} changes nothing and tuning it only burns compute; "
                "use temperature > 0 or a method that mixes in q (ens, r_fuzzy, spec_casc_*)"
            )

    def is_strict(self, knob: float | None) -> bool:
        """True when ``knob`` is a value at which the method is exactly strict."""
        if self.id == "strict":
            return True
        if self.strict_point is None or knob is None:
            return False
        return knob == self.strict_point or (self.strict_below_zero and knob < 0)


_INF = float("inf")
_LN2 = math.log(2.0)

METHODS: dict[str, MethodSpec] = {
    spec.id: spec
    for spec in (
        MethodSpec(
            "strict", strict, _strict_at, None,
            description="Leviathan/Chen speculative sampling (lossless)",
        ),
        MethodSpec(
            "always_accept", always_accept, _always_at, None,
            description="accept every draft; bonus from p (upper bound on acceptance)",
        ),
        MethodSpec(
            "ens", ens, _ens_at, "alpha", 0.0, 1.0, strict_point=0.0, grid=(0.05, 0.1, 0.2),
            search=(0.0, 0.5, False),
            description="ensemble pi = (1-alpha) p + alpha q (alpha = 1 - verifier weight w)",
        ),
        MethodSpec(
            "mentored", mentored, _mentored_at, "alpha", 0.0, 1.0, high_open=True, strict_point=0.0,
            grid=(0.3, 0.7, 0.95), search=(0.0, 0.99, False), refuses_greedy=True,
            description="accept w.p. min(1, p(x)/((1-alpha) q(x))), residual from p",
        ),
        MethodSpec(
            "cactus", cactus, _cactus_at, "delta", 0.0, _INF, strict_point=0.0, grid=(0.1, 0.25, 1.0, 10.0),
            search=(0.01, 100.0, True), refuses_greedy=True,
            description="boost p(x) to min(1, p + sqrt(2 delta p (1-p))); verifier-anchored",
        ),
        MethodSpec(
            "r_fuzzy", r_fuzzy, _r_fuzzy_at, "tau", -_INF, _LN2, strict_point=-_INF, grid=(0.05, 0.2, 0.3),
            search=(0.01, _LN2, True), needs=Needs.FULL_ROWS, strict_below_zero=True,
            description="use q where JS(p, q) <= tau nats, else p",
        ),
        MethodSpec(
            "spec_casc_opt", spec_casc_opt, _casc_opt_at, "alpha", -_INF, 1.0, strict_point=-_INF,
            grid=(-0.1, 0.0, 0.05), search=(-0.5, 0.5, False), needs=Needs.FULL_ROWS,
            description="use q where max q >= max p - alpha TV(p, q) (alpha = 0 is not strict)",
        ),
        MethodSpec(
            "spec_casc_tok", spec_casc_tok, _casc_tok_at, "alpha", -_INF, 1.0, strict_point=-_INF,
            grid=(0.0, 0.35, 0.8), search=(0.0, 1.0, False), strict_below_zero=True,
            needs=Needs.FULL_ROWS | Needs.VERIFIER_LOGITS,
            description="q on the verifier's near-argmax set A, p elsewhere (alpha = 0 is not strict)",
        ),
        MethodSpec(
            "spec_cont_dec", spec_cont_dec, _cont_dec_at, "beta", 0.0, _INF, strict_point=0.0, grid=(0.1, 0.5, 1.0),
            search=(0.01, 2.0, True),
            needs=Needs.FULL_ROWS | Needs.DRAFTER_LOGITS | Needs.EXTRA_DRAFTER_STEP,
            bonus_from_pi=True, refuses_greedy=True,
            description="contrastive pi = softmax_G(((1+beta) z_p - beta z_q)/T), bonus from pi",
        ),
        MethodSpec(
            "sglang_threshold", sglang_threshold, _threshold_at, "threshold", 0.0, 1.0, strict_point=1.0,
            grid=(0.8, 0.5, 0.2), search=(0.05, 1.0, False), needs=Needs.GREEDY_DRAFTS, refuses_greedy=True,
            server_native=True,
            description="SGLang's built-in rule: greedy drafts, accept if p(x) >= t or u <= p(x)/t (not in the paper)",
        ),
        MethodSpec(
            "typical", typical, _typical_at, "epsilon", 0.0, 1.0, strict_point=None, grid=(0.25, 0.09, 0.03),
            search=(0.01, 1.0, True), needs=Needs.VERIFIER_ROWS, refuses_greedy=True, weaker_up=True,
            description="typical acceptance (Medusa, vLLM): accept iff p(x) > min(eps, sqrt(eps) e^-H(p)), "
                        "else the verifier's argmax; deterministic, no strict point (not in the paper)",
        ),
        MethodSpec(
            "ears", ears, _ears_at, "tolerance", 0.0, 1.0, strict_point=0.0, grid=(0.1, 0.3, 0.5),
            search=(0.0, 1.0, False), needs=Needs.VERIFIER_ROWS, refuses_greedy=True,
            description="EARS: accept w.p. min(1, p(x)/q(x) + t (1 - max p)), never p(x) = 0; residual from p "
                        "(not in the paper)",
        ),
    )
}


def get_method(method: str | MethodSpec) -> MethodSpec:
    """Look up a method by id.

    Raises:
        ValueError: for an unknown id, listing the known ones.
    """
    if isinstance(method, MethodSpec):
        return method
    try:
        return METHODS[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(METHODS)}") from None
