"""A verification method's contract (``MethodSpec``): its rule, its named knobs and
the single-knob alpha view, valid ranges, strict point, paper grid, what it needs
from the backends, an optional round-level hook, and the engine that ships it.
The registries: ``relaxtune.decoding.methods`` (``METHODS``: the paper's rules,
SGLang's and the re-audited extras) and ``relaxtune.decoding.engine_methods``
(``ENGINE_METHODS``: the engines' round-level rules).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .knobs import Knob, KnobValues, check_knob_values
from .rules import Targets

__all__ = ["Needs", "MethodSpec"]


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
        primary: the named knob that alpha is (the study's ``knob`` parameter; default
            the first); every other named knob is a *further* knob, searched as a
            parameter of its own (``further_knobs``, ``relaxtune.tune.search``).
        canonical: ``(alpha, {further knob: value}) -> {further knob: value}``: the one
            form of a rule that several points give (SGLang: a single threshold at or
            above the acc one is the tied rule, ``relaxtune.decoding.rules.sglang_tied``),
            so points that are the same rule share one identity (``extra_of``); None: every
            point is its own rule.
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
    primary: str | None = None
    canonical: Callable[[float, dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not self.knobs and self.knob is not None:  # one-knob method: its knob is alpha itself
            lo, hi, log = self.search if self.search else (self.low, self.high, False)
            object.__setattr__(
                self,
                "knobs",
                (
                    Knob(
                        self.knob,
                        "float",
                        self.low,
                        self.high,
                        self.high_open,
                        self.strict_point,
                        log,
                        (lo, hi),
                    ),
                ),
            )

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

    @property
    def further_knobs(self) -> tuple[Knob, ...]:
        """The named knobs searched beside alpha, in declared order (empty for one-knob and
        knob-less methods)."""
        if len(self.knobs) <= 1:
            return ()
        primary = self.primary or self.knobs[0].name
        return tuple(k for k in self.knobs if k.name != primary)

    def alpha_view(self, knob: float, n_draft: int) -> dict[str, Any]:
        """The further knobs' values in the alpha view at draft length ``n_draft``
        (``from_alpha``, a derived knob resolved: FLy's W = min(6, N - 1)).

        Raises:
            ValueError: as ``check_knob``.
        """
        view = self.named(knob) or {}
        return {k.name: k.resolve(view[k.name], n_draft) for k in self.further_knobs}

    def extra_of(self, knob: float, values: Mapping[str, Any], n_draft: int) -> tuple[tuple[str, Any], ...]:
        """A point's further knobs that differ from the alpha view at ``n_draft``, as
        ``((name, value), ...)`` in declared order: its identity beside alpha and N
        (a point at the alpha view has none, so its records keep the alpha view's names).
        Names absent from ``values`` take the alpha view; the values are first put in
        their one form (``canonical``: SGLang's single threshold at or above acc is tied).

        Raises:
            ValueError: a value outside its knob's range.
        """
        view = self.alpha_view(knob, n_draft)
        point = {
            k.name: view[k.name] if values.get(k.name) is None else k.check(values[k.name], self.id)
            for k in self.further_knobs
        }
        if self.canonical is not None and point:
            point = self.canonical(float(knob), point)
        return tuple((k.name, point[k.name]) for k in self.further_knobs if point[k.name] != view[k.name])

    def point_knobs(self, knob: float | None, extra: Mapping[str, Any] | tuple = ()) -> dict[str, Any] | None:
        """Every named knob of a point: the alpha view of ``knob`` with the further knobs
        of ``extra`` (``extra_of``) in place, validated (None for knob-less methods).

        Raises:
            ValueError: as ``check_knob``.
        """
        named = self.named(knob)
        if named is None or not extra:
            return named
        return check_knob_values(self.knobs, named | dict(extra), self.id)

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
                f"{self.knob} = {knob!r} is outside the valid range of {self.id!r}: [{self.low}, {self.high}{close}"
            )
        return value

    def check_n_draft(self, n_draft: int) -> None:
        """Refuse a draft length N at which a further knob has no valid value (FLy's
        window W < N: N >= 2, as vLLM refuses N = 1; ``Knob.search_at``).

        Raises:
            ValueError: naming the method, N and the knob's bound.
        """
        for k in self.further_knobs:
            try:
                k.search_at(n_draft)
            except ValueError as err:
                raise ValueError(f"method {self.id!r} cannot run at draft length N={n_draft}: {err}") from None

    def check_temperature(self, temperature: float | None) -> None:
        """Refuse T = 0 for methods that collapse to strict under greedy sampling, and
        T > 0 for greedy-only rules.

        Raises:
            ValueError: naming the reason.
        """
        if self.refuses_sampling and temperature is not None and temperature > 0:
            raise ValueError(
                f"method {self.id!r} is greedy-only as its engine runs it: it ignores the temperature "
                f"(here {temperature:g}) and emits the verifier's argmax; measure it at temperature 0 "
                "(a task spec with sampling: {temperature: 0}; generate and eval: --temperature 0)"
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
