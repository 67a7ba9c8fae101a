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
- ``untrusted``: a returned value is compared only when every type in it
  behaves as the standard library's: its special methods (``__eq__``,
  ``__sub__``, ``__len__``, ``__iter__``...) are the interpreter's own or
  functions compiled from the standard library (or numpy); so a ``Counter``,
  ``defaultdict``, ``OrderedDict``, ``deque``, ``Fraction`` or a namedtuple is
  compared as the official harnesses compare it (``==``), while a class of the
  solution's own that overrides any of them (an object equal to everything) is
  refused (our policy; the official harnesses compare whatever comes back).
"""

from __future__ import annotations

import collections
import sysconfig
import types
from decimal import Decimal, InvalidOperation

__all__ = ["PRELUDE_MODULES", "prelude", "same_lines", "same_value", "untrusted", "short", "trusted_dirs"]

PRELUDE_MODULES = (
    "string",
    "re",
    "datetime",
    "collections",
    "heapq",
    "bisect",
    "copy",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "operator",
    "io",
    "sys",
    "json",
    "builtins",
    "typing",
)
RECURSION_LIMIT = 50000
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (not the interpreter's own)
# special names that never decide how a value compares, prints or iterates
_INERT = frozenset(
    {
        "__init__",
        "__new__",
        "__module__",
        "__qualname__",
        "__doc__",
        "__dict__",
        "__weakref__",
        "__slots__",
        "__annotations__",
        "__match_args__",
        "__getnewargs__",
        "__getnewargs_ex__",
        "__reduce__",
        "__reduce_ex__",
        "__init_subclass__",
        "__class_getitem__",
        "__orig_bases__",
        "__parameters__",
        "__firstlineno__",
        "__static_attributes__",
        "__copy__",
        "__deepcopy__",
        "__getstate__",
        "__setstate__",
        "__del__",
        "__set_name__",
        "__abstractmethods__",
        "__subclasshook__",
        "__type_params__",
        "__annotate__",
        "__classcell__",
        "__post_init__",
        "__dataclass_fields__",
        "__dataclass_params__",
        "__final__",
        "__protocol_attrs__",
        "__non_callable_proto_members__",
        "__callable_proto_members_only__",
        "__required_keys__",
        "__optional_keys__",
        "__total__",
        "__mutable_keys__",
        "__readonly_keys__",
        "__attrs_attrs__",
        "__wrapped__",
        "__signature__",
        "__text_signature__",
        "__objclass__",
    }
)
_NATIVE = (
    types.BuiltinFunctionType,
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.MethodWrapperType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
)
_ITERATE = (
    (dict, None),
    (list, list.__iter__),
    (tuple, tuple.__iter__),
    (set, set.__iter__),
    (frozenset, frozenset.__iter__),
    (collections.deque, collections.deque.__iter__),
)


def trusted_dirs(extra=()) -> tuple:
    """Where code that decides a trusted value's behaviour may come from: the standard
    library's directories and ``extra`` (numpy's)."""
    paths = sysconfig.get_paths()
    return tuple(sorted({paths["stdlib"], paths["platstdlib"], *extra})) + ("<frozen ",)


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
    if isinstance(got, tuple):
        got = list(got)
    try:
        return bool(got == want)
    except (RecursionError, ValueError, TypeError):
        return False


def _own_behaviour(
    kind,
    dirs,
    _type=type,
    _isinstance=isinstance,
    _getattr=getattr,
    _str=str,
    _mro=type.__dict__["__mro__"],
    _flags=type.__dict__["__flags__"],
    _vars=type.__dict__["__dict__"],
    _FunctionType=types.FunctionType,
    _native=_NATIVE,
    _wrappers=(classmethod, staticmethod),
    _property=property,
    _inert=_INERT,
) -> str | None:
    """The first special method of class ``kind`` (or of a class it inherits from) that is
    not the interpreter's own nor compiled from ``dirs``, as "Class.__name__"; None when
    there is none. Everything it uses is bound when it is defined."""
    for klass in _mro.__get__(kind):
        if not _flags.__get__(klass) & _HEAPTYPE:
            continue  # the interpreter's own class: int, list, dict, defaultdict, deque...
        for name, attr in _vars.__get__(klass).items():
            if _type(name) is not _str or not (name[:2] == "__" == name[-2:]) or name in _inert or attr is None:
                continue
            if _isinstance(attr, _wrappers):
                attr = attr.__func__
            if _isinstance(attr, _property):
                attr = attr.fget
            if _type(attr) is _FunctionType:
                if attr.__code__.co_filename.startswith(dirs):
                    continue
            elif _isinstance(attr, _native) and _getattr(attr, "__name__", None) == name:
                continue
            return f"{_getattr(klass, '__qualname__', '?')}.{name}"
    return None


def untrusted(
    value, dirs, _type=type, _id=id, _set=set, _issubclass=issubclass, _dict=dict, _iterate=_ITERATE, own=_own_behaviour
) -> str | None:
    """Why ``value`` is not compared (see module doc): "Class.__method__" of the first
    value inside it whose type has a special method of the solution's own; None when
    every type in it behaves as the standard library's. Containers (subclasses of
    dict, list, tuple, set, frozenset, deque) are walked through their base type's
    own iteration, any depth, each object once. Every builtin it uses is bound when
    it is defined, so a solution that patches ``builtins`` cannot change the check."""
    stack, seen, verdicts = [value], _set(), {}
    while stack:
        item = stack.pop()
        kind = _type(item)
        if kind not in verdicts:
            verdicts[kind] = own(kind, dirs)
        if verdicts[kind] is not None:
            return verdicts[kind]
        if _id(item) in seen:
            continue
        seen.add(_id(item))
        for base, walk in _iterate:
            if _issubclass(kind, base):
                if base is _dict:
                    stack.extend(_dict.keys(item))
                    stack.extend(_dict.values(item))
                else:
                    stack.extend(walk(item))
                break
    return None


def short(value, limit: int = 120) -> str:
    """``repr`` cut to about ``limit`` characters (head ... tail)."""
    text = value if isinstance(value, str) else repr(value)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"
