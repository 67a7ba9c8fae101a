"""The math-verify side of the math grader: parse, verify, and the exact and integer
checks, in worker processes (``workers.WorkerPool``) that are killed at their deadline.

math-verify and sympy evaluate what they parse, in C and holding the GIL:
``\\boxed{10^{10^{10}}}`` starts computing a ten-billion-digit integer (hours, GBs of
memory) that no thread can interrupt; a process can be killed. Run as a script,
this module is such a worker: it serves requests on stdin, one JSON line each,
and answers each with one JSON line (``serve``). It imports only math-verify,
sympy, the standard library and its siblings ``mathtolerance`` and
``mathverify_compat`` (no torch), so a worker starts in about a second.
math-verify's own signal timeouts are off (``parsing_timeout=None``,
``timeout_seconds=None``): the worker's deadline replaces them.

Rules (``check``): the verdict is ``math_verify.verify``'s, so every equivalence it
accepts is kept (percent ``10\\%`` = ``10``, ``\\infty`` = ``\\infty``, ``n = 204`` =
``204``...) except where mathematical truth says otherwise; each addition is
documented and tested (README, "Grading policy"):

- a list with an ellipsis term is compared term by term, each pair held to the numeric
  tolerance below (``compare_sequences``:
  math-verify reads ``1, 2, \\ldots, n`` and ``1, 3, 5, \\ldots, 2n-1`` alike);
- what math-verify calls different is equal when sympy proves two exact numbers
  equal with ``i`` as the imaginary unit (``\\sqrt{-4}`` = ``2i``), or a relation in
  one variable describes the other side's interval (``2 \\le x \\le 5`` =
  ``[2, 5]``) (``truly_equal``);
- two exact finite numbers (no float, no percent) that sympy proves different
  are different, although math-verify's numeric check chops ``1/2^98 - 1/2^99``
  to 0;
- numbers farther apart than the policy's numeric tolerance are different, although
  math-verify rounds floats to 6 decimal places (``0.00000001`` = ``0.00000002``), also
  inside a list, set, tuple, interval, matrix or relation (``verify_within``);
- integer tasks (AIME, ``integer_range``): besides math-verify's verdict, the
  answer's value must be an integer in the range: the right side of ``n = 204``,
  a percent's number, ``\\text{204}`` and ``{204}`` (which math-verify reads as a
  symbol and a set), a decimal when integral (``204.0``).
"""

import sys

if __name__ == "__main__" and sys.path and sys.path[0] == __file__.rpartition("/")[0]:
    sys.path.pop(0)  # our math.py and numbers.py must not shadow the standard library's

import functools
import json
import logging
import re


def _sibling(name: str):
    """The module ``name`` of this folder, loaded from its file: the worker runs this file as a
    script, outside the package, and its folder is off ``sys.path``."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __package__:
    from .mathtolerance import values_differ
    from .mathverify_compat import verify_refusing
else:  # the worker script
    values_differ = _sibling("mathtolerance").values_differ
    verify_refusing = _sibling("mathverify_compat").verify_refusing

__all__ = ["check", "parse_gold", "serve", "verify_within"]

SHOWN_CHARS = 2000  # of the answer read, in a verdict
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call that its timeouts are off


def _parse(text: str):
    from math_verify import parse

    return parse(text, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str):
    """Parse a gold answer (already normalised and boxed by the caller); cached, as
    every sample of every trial grades against the same golds.

    Raises:
        ValueError: when math-verify reads nothing from it.
    """
    parsed = _parse(gold)
    if not parsed:
        raise ValueError(f"gold answer {gold!r} does not parse")
    return parsed


def _exactly_different(gold, pred) -> bool:
    """Both first parses are finite exact numbers (no float, no percent) that sympy
    proves unequal (math-verify's numeric check would chop a tiny difference to 0)."""
    import sympy

    def exact(x) -> bool:
        return (
            isinstance(x, sympy.Expr)
            and bool(x.is_number)
            and bool(x.is_finite)
            and not x.atoms(sympy.Float, sympy.UnevaluatedExpr)
        )

    g, p = gold[0], pred[0]
    return exact(g) and exact(p) and sympy.simplify(g - p).is_zero is False


def _integer_value(expr):
    """The integer an answer stands for (see module doc), or None."""
    import sympy
    from sympy.logic.boolalg import And

    while isinstance(expr, (sympy.core.relational.Relational, And)):  # a chain a = b = c is an And, in order
        expr = expr.rhs if not isinstance(expr, And) else getattr(expr, "_unsorted_args", expr.args)[-1]
    if isinstance(expr, (sympy.FiniteSet, sympy.Tuple)) and len(expr) == 1:
        expr = next(iter(expr))
    if isinstance(expr, sympy.Symbol):  # \text{204}: a symbol named by its digits
        name = expr.name.strip().strip("()").strip()
        if not _NUMBER.fullmatch(name):
            return None
        expr = sympy.Float(name) if "." in name else sympy.Integer(name)
    if not isinstance(expr, sympy.Expr) or not expr.is_number:
        return None
    pct = [a for a in expr.atoms(sympy.UnevaluatedExpr) if a == sympy.UnevaluatedExpr(sympy.Rational(1, 100))]
    if pct and isinstance(expr, sympy.Mul):
        expr = expr / pct[0]
    expr = expr.doit()
    if expr.atoms(sympy.Float):
        value = float(expr)
        return int(value) if abs(value) < 2**53 and value.is_integer() else None
    return int(expr) if expr.is_integer else None


_ELLIPSIS_TERM = re.compile(r"(?:\\[lc]?dots[bc]?|\\cdots|\.\.\.|…)")
_ELLIPSIS = re.compile(r"\\[lc]?dots[bc]?(?![A-Za-z])|\.\.\.|…")
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_DELIMITERS = [
    (r"\{", r"\}"),
    ("(", ")"),
    ("[", "]"),
    (r"\left\{", r"\right\}"),
    (r"\left(", r"\right)"),
    (r"\left[", r"\right]"),
]


def _whole_box(text: str) -> str | None:
    """The content of ``text`` when it is one ``\\boxed{...}`` (braces matched), else None."""
    text = text.strip()
    if not text.startswith("\\boxed{"):
        return None
    depth = 0
    for i in range(len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[len("\\boxed{") : i] if i == len(text) - 1 else None
    return None


def _terms(math: str) -> list[str]:
    """The comma-separated terms of a list, set or tuple (outer delimiters dropped)."""
    math = math.strip().strip("$").strip()
    for left, right in _DELIMITERS:
        if math.startswith(left) and math.endswith(right) and len(math) > len(left) + len(right):
            math = math[len(left) : -len(right)]
            break
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(math):
        depth += 1 if ch in "{([" else -1 if ch in "})]" else 0
        if ch == "," and depth == 0:
            terms.append(math[start:i])
            start = i + 1
    return [t.strip() for t in terms + [math[start:]]]


def _term(text: str):
    parsed = _parse(f"\\boxed{{{text}}}")
    return parsed if parsed else None


def _same(a: str, b: str, tolerance: dict | None) -> bool:
    """Two terms equal to math-verify, held to ``tolerance`` (``verify_within``) unless None."""
    from math_verify import verify

    pa, pb = _term(a), _term(b)
    if pa is None or pb is None:
        return False
    if tolerance is None:
        return bool(verify(pa, pb, timeout_seconds=None))
    return verify_within(pa, pb, **tolerance) == (True, "")


def _extends(short: list[str], long: list[str], tolerance: dict | None) -> bool:
    """``long`` starts with ``short`` and its further terms continue the arithmetic
    progression of ``short``'s first two (``1, 2, 3`` extends ``1, 2``)."""
    import sympy

    if len(short) < 2 or not all(_same(a, b, tolerance) for a, b in zip(short, long)):
        return False
    first, second = _term(short[0]), _term(short[1])
    if first is None or second is None or not all(isinstance(x[0], sympy.Expr) for x in (first, second)):
        return False
    a, d = first[0], second[0] - first[0]
    for k in range(len(short), len(long)):
        term = _term(long[k])
        if term is None or not isinstance(term[0], sympy.Expr) or sympy.simplify(term[0] - (a + k * d)) != 0:
            return False
    return True


def compare_sequences(text: str, gold: str, tolerance: dict | None = None):
    """A list with an ellipsis (``1, 3, 5, \\ldots, 2n-1``), term by term: math-verify
    reads ``1, 2, \\ldots, n`` and ``1, 3, 5, \\ldots, 2n-1`` as the same number; each pair
    of terms is held to ``tolerance`` (as in ``check``) unless None.

    Returns:
        None when neither side is a comma list with an ellipsis term (math-verify
        decides); else ``(equal, detail)``: equal when the terms after the
        ellipsis agree one by one and those before it agree, one side's extra
        leading terms continuing the arithmetic progression of the other's.
    """
    g_terms = _terms(_whole_box(gold) or gold)
    g_dots = [i for i, t in enumerate(g_terms) if _ELLIPSIS_TERM.fullmatch(t)]
    answer = _whole_box(text)
    if answer is None:  # no box: the last math span with an ellipsis, and only against such a gold
        if not g_dots:
            return None  # "$a_1, \\ldots, a_n$" in the reasoning is no answer
        spans = [next(g for g in m.groups() if g is not None) for m in _MATH_SPAN.finditer(text)]
        answer = next((s for s in reversed(spans) if _ELLIPSIS.search(s)), None)
    p_terms = _terms(answer) if answer is not None else []
    p_dots = [i for i, t in enumerate(p_terms) if _ELLIPSIS_TERM.fullmatch(t)]
    if not g_dots and not p_dots:
        return None
    detail = "compared term by term (a list with an ellipsis)"
    if not g_dots or not p_dots:
        return False, detail
    if len(g_dots) > 1 or len(p_dots) > 1:
        same = g_dots == p_dots and len(g_terms) == len(p_terms)
        pairs = enumerate(zip(g_terms, p_terms))
        return same and all(i in g_dots or _same(a, b, tolerance) for i, (a, b) in pairs), detail
    (gi,), (pi,) = g_dots, p_dots
    g_head, g_tail, p_head, p_tail = g_terms[:gi], g_terms[gi + 1 :], p_terms[:pi], p_terms[pi + 1 :]
    if len(g_tail) != len(p_tail) or not all(_same(a, b, tolerance) for a, b in zip(g_tail, p_tail)):
        return False, detail
    if len(g_head) == len(p_head):
        return all(_same(a, b, tolerance) for a, b in zip(g_head, p_head)), detail
    short, long = sorted((g_head, p_head), key=len)
    return _extends(short, long, tolerance), detail


def _as_number(x):
    """``x`` with math-verify's symbol ``i`` as the imaginary unit and unevaluated
    powers evaluated, when it is then a finite exact number; else None."""
    import sympy

    if not isinstance(x, sympy.Expr):
        return None
    if x.free_symbols and {str(v) for v in x.free_symbols} == {"i"}:
        x = x.subs(next(iter(x.free_symbols)), sympy.I)
    x = x.doit()
    exact = bool(x.is_number) and x.is_finite is not False and not x.atoms(sympy.Float, sympy.UnevaluatedExpr)
    return x if exact else None


def _as_set(x):
    """A relation in one variable (``2 \\le x \\le 5``) as the set it describes, a set as
    itself; else None."""
    import sympy
    from sympy.logic.boolalg import And

    if isinstance(x, sympy.Set):
        return x
    if isinstance(x, (sympy.core.relational.Relational, And)) and len(x.free_symbols) == 1:
        try:
            return x.as_set()
        except (NotImplementedError, TypeError, ValueError):
            return None
    return None


def truly_equal(gold, pred) -> str:
    """Why the first parses of ``gold`` and ``pred`` are equal although math-verify
    says they differ ("" when they are not shown equal): equal exact numbers once
    ``i`` is the imaginary unit (``\\sqrt{-4}`` = ``2i``), or a relation in one
    variable and an interval describing the same set (``2 \\le x \\le 5`` = ``[2, 5]``,
    which math-verify accepts in one direction only)."""
    import sympy

    g, p = gold[0], pred[0]
    gn, pn = _as_number(g), _as_number(p)
    if gn is not None and pn is not None and sympy.simplify(gn - pn).is_zero:
        return "equal exact numbers (math-verify misses it)"
    gs, ps = _as_set(g), _as_set(p)
    if gs is not None and ps is not None and (isinstance(g, sympy.Set) != isinstance(p, sympy.Set)) and gs == ps:
        return "a relation and the interval it describes"
    return ""


def verify_within(gold, pred, relative: float, absolute: float) -> tuple[bool, str]:
    """math-verify's verdict on ``gold`` and ``pred`` (parses), and why it is vetoed: ""
    unless it says equal only through numbers farther apart than the tolerance
    (``mathtolerance.values_differ``), wherever it compares them (single numbers, elements
    of sets, tuples and matrices, ends of intervals, sides of relations:
    ``mathverify_compat.verify_refusing``). math-verify runs once, twice only when a
    refused pair decided its verdict."""
    from math_verify import verify

    strict, refused = verify_refusing(gold, pred, lambda a, b: values_differ(a, b, relative, absolute))
    if strict or not refused:
        return strict, ""
    official = bool(verify(gold, pred, timeout_seconds=None))
    return official, refused[0] if official else ""


def check(text: str, gold: str, integer_range=None, tolerance=None) -> dict:
    """Grade ``text`` (``\\boxed{answer}``, or the answer section when it has no box)
    against ``gold`` (both already normalised, the gold boxed unless it holds ``$``);
    ``tolerance`` (``{"relative", "absolute"}``, the grading policy's ``numeric``) vetoes
    math-verify's equality through numbers farther apart (``verify_within``); None: no veto.

    Returns:
        ``{"verdict": "correct" | "wrong" | "no_answer", "shown": answer read or None,
        "detail": why the verdict differs from math-verify's own, or ""}``.

    Raises:
        ValueError: the gold does not parse.
    """
    from math_verify import verify

    from_sequences = compare_sequences(text, gold, tolerance)
    gold_parsed = parse_gold(gold)
    pred = _parse(text)
    if not pred and from_sequences is None:
        return {"verdict": "no_answer", "shown": None, "detail": "no parsable answer"}
    shown = (str(pred[-1]) if len(pred) > 1 else str(pred[0])) if pred else text
    if from_sequences is not None:
        ok, detail = from_sequences
    else:
        if tolerance is not None:
            ok, too_far = verify_within(gold_parsed, pred, **tolerance)
        else:
            ok, too_far = verify(gold_parsed, pred, timeout_seconds=None), ""
        detail = ""
        if ok and _exactly_different(gold_parsed, pred):
            ok, detail = False, "exactly different (math-verify compares these only to 15 digits)"
        elif too_far:
            ok, detail = False, too_far
        elif not ok and (why := truly_equal(gold_parsed, pred)):
            ok, detail = True, why
    if integer_range is not None:
        value = _integer_value(pred[0]) if pred else None
        lo, hi = integer_range
        if value is None:
            ok, detail = False, "not an integer"
        elif not lo <= value <= hi:
            ok, detail = False, f"outside [{lo}, {hi}]"
    return {"verdict": "correct" if ok else "wrong", "shown": shown[:SHOWN_CHARS], "detail": detail}


def serve(memory_mb: int) -> None:
    """The worker's loop: a line ``ready`` once imported, then for each request line
    ``{"text", "gold", "integer_range", "tolerance"}`` one reply line, ``check``'s dict or
    ``{"error": "..."}``; ends at the end of stdin. The address space is capped at
    ``memory_mb`` MiB (a runaway evaluation raises MemoryError, reported as an error)."""
    import resource

    import math_verify  # noqa: F401 - imported before "ready"
    import sympy  # noqa: F401

    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20,) * 2)
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # a big exact answer prints whole (it is cut to SHOWN_CHARS)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = check(request["text"], request["gold"], request.get("integer_range"), request.get("tolerance"))
        except Exception as err:
            reply = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
