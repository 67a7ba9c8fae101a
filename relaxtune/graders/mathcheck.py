"""The math-verify side of the math grader: parse, verify, and the exact and integer
checks, in worker processes (``workers.WorkerPool``) that are killed at their deadline.

math-verify and sympy evaluate what they parse, in C and holding the GIL:
``\\boxed{10^{10^{10}}}`` starts computing a ten-billion-digit integer (hours, GBs of
memory) that no thread can interrupt; a process can be killed. Run as a script,
this module is such a worker: it serves requests on stdin, one JSON line each,
and answers each with one JSON line (``serve``). It imports only math-verify,
sympy and the standard library (no torch), so a worker starts in about a second.
math-verify's own signal timeouts are off (``parsing_timeout=None``,
``timeout_seconds=None``): the worker's deadline replaces them.

Rules (``check``): the verdict is ``math_verify.verify``'s, so every equivalence it
accepts is kept (percent ``10\\%`` = ``10``, ``\\infty`` = ``\\infty``, ``n = 204`` =
``204``...); the additions only make it stricter, each documented and tested
(README, "Grading policy"):

- two exact finite numbers (no float, no percent) that sympy proves different
  are different, although math-verify's numeric check chops ``1/2^98 - 1/2^99``
  to 0;
- integer tasks (AIME, ``integer_range``): besides math-verify's verdict, the
  answer's value must be an integer in the range: the right side of ``n = 204``,
  a percent's number, ``\\text{204}`` and ``{204}`` (which math-verify reads as a
  symbol and a set), a decimal when integral (``204.0``).
"""

import sys

if __name__ == "__main__" and sys.path and sys.path[0] == __file__.rpartition("/")[0]:
    sys.path.pop(0)  # our math.py and numbers.py must not shadow the standard library's

import functools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402

__all__ = ["check", "parse_gold", "serve"]

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
        return (isinstance(x, sympy.Expr) and bool(x.is_number) and bool(x.is_finite)
                and not x.atoms(sympy.Float, sympy.UnevaluatedExpr))

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


def check(text: str, gold: str, integer_range=None) -> dict:
    """Grade ``text`` (``\\boxed{answer}``, or the answer section when it has no box)
    against ``gold`` (both already normalised, the gold boxed unless it holds ``$``).

    Returns:
        ``{"verdict": "correct" | "wrong" | "no_answer", "shown": answer read or None,
        "detail": why the verdict differs from math-verify's own, or ""}``.

    Raises:
        ValueError: the gold does not parse.
    """
    from math_verify import verify

    gold_parsed = parse_gold(gold)
    pred = _parse(text)
    if not pred:
        return {"verdict": "no_answer", "shown": None, "detail": "no parsable answer"}
    shown = str(pred[-1]) if len(pred) > 1 else str(pred[0])
    ok = verify(gold_parsed, pred, timeout_seconds=None)
    detail = ""
    if ok and _exactly_different(gold_parsed, pred):
        ok, detail = False, "exactly different (math-verify compares these only to 15 digits)"
    if integer_range is not None:
        value = _integer_value(pred[0])
        lo, hi = integer_range
        if value is None:
            ok, detail = False, "not an integer"
        elif not lo <= value <= hi:
            ok, detail = False, f"outside [{lo}, {hi}]"
    return {"verdict": "correct" if ok else "wrong", "shown": shown[:SHOWN_CHARS], "detail": detail}


def serve(memory_mb: int) -> None:
    """The worker's loop: a line ``ready`` once imported, then for each request line
    ``{"text", "gold", "integer_range"}`` one reply line, ``check``'s dict or
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
            reply = check(request["text"], request["gold"], request.get("integer_range"))
        except Exception as err:  # noqa: BLE001 - every failure is the caller's grader error
            reply = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 2048)
