"""Named knobs of a verification rule: each knob under the name its engine gives it
(``fly_entropy_threshold``, ``relaxed_topk``, ``speculative_accept_threshold_acc``;
the paper's letter for the paper's rules), its type, valid range, strict value and
search scale.

A method declares a tuple of ``Knob`` (``relaxtune.decoding.methods.MethodSpec.knobs``).
The tuner searches every named knob: the *primary* one (``MethodSpec.primary``) is
alpha, the study's ``knob`` parameter, which ``MethodSpec.from_alpha`` maps onto
all the named knobs (the others at the engine's defaults, or tied to alpha:
SGLang's two thresholds); each *further* knob is a study parameter of its own,
under its engine name (``relaxtune.tune.search``), and a point's value of it
overrides the alpha view's (``MethodSpec.point_knobs``).

Pure values: no tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Knob", "KnobValues", "check_knob_values"]

KnobValues = Mapping[str, float]  # knob name -> value (ints stay ints)


@dataclass(frozen=True)
class Knob:
    """One named knob.

    Attributes:
        name: the engine's own name for it (the paper's letter for paper rules).
        kind: ``"float"`` or ``"int"``.
        low, high: valid range; ``high_open`` excludes ``high`` (an infinite
            ``high`` is always excluded).
        strict: the value at which this knob alone, or together with the other
            knobs at theirs (see ``MethodSpec.strict_when_any``), gives strict
            verification; None when no value does.
        log: search on a log scale.
        search: ``(low, high)`` range for the tuner (defaults to ``(low, high)``).
        default: the engine's default (None when the engine derives it, e.g.
            vLLM's ``fly_window_size = min(6, N - 1)``).
        doc: one line: meaning and unit.
        derived: when set, None is a valid value meaning "the engine derives it"
            (this line says how, e.g. ``min(6, N - 1)``); the rule resolves it.
        derive: the engine's derivation from the draft length N (``derived``'s formula),
            for the tuner, which searches the knob as a number.
        weaker_up: a larger value relaxes less (FLy's window W, SGLang's thresholds):
            the tuner's strength runs from the top of the search range.
        below_n: the value must stay below the draft length N (FLy's W < N): the
            search range at N ends at N - 1.
    """

    name: str
    kind: str = "float"
    low: float = 0.0
    high: float = math.inf
    high_open: bool = False
    strict: float | None = None
    log: bool = False
    search: tuple[float, float] | None = None
    default: float | None = None
    doc: str = ""
    derived: str = ""
    derive: Callable[[int], float] | None = None
    weaker_up: bool = False
    below_n: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("float", "int"):
            raise ValueError(f"knob {self.name!r}: kind must be 'float' or 'int', got {self.kind!r}")

    def check(self, value: float | None, method: str) -> float | int | None:
        """Validate ``value`` and return it as this knob's type. The strict value is
        always valid (FLy's infinite threshold); None only for a derived knob.

        Raises:
            ValueError: NaN, outside ``[low, high]`` (``[low, high)`` when open or
                infinite), or a non-integer value for an int knob; the message names
                the method, the knob and its range.
        """
        if value is None and self.derived:
            return None
        if value is None:
            raise ValueError(f"{self.name} of {method!r} needs a value")
        v = float(value)
        if self.strict is not None and v == self.strict:
            return int(v) if self.kind == "int" else v
        open_top = self.high_open or math.isinf(self.high)
        upper_ok = v < self.high if open_top else v <= self.high
        if math.isnan(v) or v < self.low or not upper_ok:
            close = ")" if open_top else "]"
            raise ValueError(
                f"{self.name} = {value!r} is outside the valid range of {method!r}: [{self.low}, {self.high}{close}"
            )
        if self.kind == "int":
            if v != int(v):
                raise ValueError(f"{self.name} of {method!r} is an integer, got {value!r}")
            return int(v)
        return v

    def search_at(self, n_draft: int) -> tuple[float, float]:
        """The tuner's range ``(low, high)`` for this knob at draft length ``n_draft``
        (``search``, else the valid range; ``below_n`` ends it at N - 1).

        Raises:
            ValueError: an empty range (e.g. ``below_n`` at N = 1).
        """
        low, high = self.search if self.search is not None else (self.low, self.high)
        if self.below_n:
            high = min(high, n_draft - 1)
        if high < low:
            raise ValueError(f"{self.name} has no value in its range at N={n_draft} (it needs N >= {low + 1:g})")
        return low, high

    def resolve(self, value: float | None, n_draft: int) -> float | int | None:
        """``value``, or the engine's derivation at ``n_draft`` for None (``derive``)."""
        if value is None and self.derive is not None:
            return self.derive(n_draft)
        return value


def check_knob_values(knobs: tuple[Knob, ...], values: KnobValues, method: str) -> dict[str, float | int]:
    """Validate a full mapping of named knob values against ``knobs``.

    Returns:
        ``{name: value}`` in the declared order, each value of its knob's type.

    Raises:
        ValueError: a missing or unknown name (both listed), or a value that
            ``Knob.check`` refuses.
    """
    names = [k.name for k in knobs]
    unknown = sorted(set(values) - set(names))
    missing = [n for n in names if n not in values]
    if unknown or missing:
        raise ValueError(
            f"method {method!r} takes the knobs {', '.join(names) or '(none)'}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    return {k.name: k.check(values[k.name], method) for k in knobs}
