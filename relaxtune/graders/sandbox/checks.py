"""What the sandbox harness compares, written from the official graders' protocols.

Standard library only: the harness imports this module inside the sandbox,
under whichever interpreter the sandbox runs (possibly the system Python 3.8+).

- ``prelude()``: LiveCodeBench's import prelude (its runner's ``import_string``
  in ``lcb_runner/evaluation/testing_util.py``): every test program, stdin and
  call-based, starts with ``from M import *`` then ``import M`` for these
  modules and ``sys.setrecursionlimit(50000)``.
- ``same_lines``: LiveCodeBench's stdout check (``grade_stdio``): both texts
  stripped and split on newlines, each line stripped; the line counts must
  agree; a line matches exactly or, token by token, as ``decimal.Decimal``
  values (so ``2.50`` equals ``2.5`` but ``0.333333`` does not equal
  ``0.333333333333``: there is no tolerance).
- ``same_value``: LiveCodeBench's call-based check (``grade_call_based``): a
  returned tuple counts as a list, then plain ``==`` against the JSON output.
- ``not_plain``: returned values are compared only as plain builtin values
  (exact ``str``/``int``/``float``/``bool``/``None`` inside exact
  ``list``/``tuple``/``dict``/``set``/``frozenset``), so a type that overrides
  ``__eq__`` cannot pass a test (our policy; the official harnesses compare
  whatever comes back).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

__all__ = ["PRELUDE_MODULES", "prelude", "same_lines", "same_value", "not_plain", "short"]

PRELUDE_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                   "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")
RECURSION_LIMIT = 50000
_SCALARS = frozenset({str, int, float, bool, type(None)})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})


def prelude() -> str:
    """LiveCodeBench's prelude as source: star imports in the runner's order (``builtins``
    after the others restores names such as ``pow`` that ``math`` shadows, ``typing``
    last brings ``List``...), the modules themselves, the raised recursion limit."""
    stars = [f"from {m} import *" for m in PRELUDE_MODULES]
    plain = [f"import {m}" for m in PRELUDE_MODULES if m not in ("builtins", "typing")]
    return "\n".join(stars + plain + [f"sys.setrecursionlimit({RECURSION_LIMIT})", ""])


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except (InvalidOperation, ValueError):
        return None


def same_lines(got: str, want: str) -> tuple[bool, str]:
    """LiveCodeBench's stdout comparison (see module doc). Returns ``(same, why_not)``."""
    got_lines, want_lines = _lines(got), _lines(want)
    if len(got_lines) != len(want_lines):
        return False, f"{len(got_lines)} output lines, expected {len(want_lines)}"
    for i, (g, w) in enumerate(zip(got_lines, want_lines)):
        if g == w:
            continue
        dg, dw = _decimals(g), _decimals(w)
        try:
            if dg is not None and dw is not None and dg == dw:
                continue
        except InvalidOperation:  # a signalling NaN never compares
            pass
        return False, f"line {i + 1}: expected {short(w)}, got {short(g)}"
    return True, ""


def same_value(got, want) -> bool:
    """LiveCodeBench's call-based comparison: a returned tuple counts as a list."""
    if type(got) is tuple:
        got = list(got)
    try:
        return bool(got == want)
    except (RecursionError, ValueError, TypeError):
        return False


def not_plain(value, _type=type, _id=id, _set=set, _dict=dict, _getattr=getattr, _scalars=_SCALARS,
              _containers=_CONTAINERS) -> str | None:
    """The type name of the first value inside ``value`` that is not a plain builtin
    value (see module doc), or None when all are. Iterative: any depth, shared and
    self-referencing containers visited once. Every builtin it uses is bound when it
    is defined, so a solution that patches ``builtins`` cannot change the check."""
    stack, seen = [value], _set()
    while stack:
        item = stack.pop()
        kind = _type(item)
        if kind in _scalars:
            continue
        if kind not in _containers:
            return f"{_getattr(kind, '__module__', '?')}.{_getattr(kind, '__qualname__', '?')}"
        if _id(item) in seen:
            continue
        seen.add(_id(item))
        if kind is _dict:
            stack.extend(_dict.keys(item))
            stack.extend(_dict.values(item))
        else:
            stack.extend(item)
    return None


def short(value, limit: int = 120) -> str:
    """``repr`` cut to about ``limit`` characters (head ... tail)."""
    text = value if isinstance(value, str) else repr(value)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2:]}"
