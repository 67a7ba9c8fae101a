"""Graders: turn a response into a verdict.

``math`` (math-verify), ``choice`` (multiple choice letters) and ``code``
(execution in ``graders/sandbox``). Every grader returns a ``Verdict``; a grader
failure is its own verdict and never counts as correct. Where they deliberately
differ from the official graders is listed in the README ("Grading policy") and
tested in ``tests/conformance/``.

May import: nothing of relaxtune outside this wing.
"""

from .base import Verdict, answer_section

__all__ = ["Verdict", "answer_section", "grade"]


def grade(kind: str, response: str, gold, *, truncated: bool = False, **options) -> Verdict:
    """Grade ``response`` against ``gold`` with the grader ``kind`` ("math", "choice", "code").

    Raises:
        ValueError: unknown grader kind.
    """
    if kind == "math":
        from .math import grade_math

        return grade_math(response, gold, truncated=truncated, **options)
    if kind == "choice":
        from .choice import grade_choice

        return grade_choice(response, gold, truncated=truncated, **options)
    if kind == "code":
        from .code import grade_code

        return grade_code(response, gold, **options)
    raise ValueError(f"unknown grader {kind!r}; known: math, choice, code")
