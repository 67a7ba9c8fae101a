"""What every grader returns, and the answer section of a response."""

from __future__ import annotations

from dataclasses import asdict, dataclass

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class Verdict:
    """A grader's decision on one response.

    Attributes:
        correct: counts as solved.
        verdict: a short label: "correct", "wrong", "no_answer", and for code
            "pass", "wrong_answer", "time_limit", "runtime_error", "memory",
            "output_limit"; "grader_error" is our failure (never correct).
        extracted: the answer the grader read (None when there was none).
        detail: a human-readable note (first failing test, error text).
    """

    correct: bool
    verdict: str
    extracted: str | None = None
    detail: str = ""

    def to_dict(self) -> dict:
        """Plain dict for records."""
        return asdict(self)


def answer_section(response: str) -> str | None:
    """The text after the thinking block: after the last ``</think>``, or all of
    it when the response has no thinking block; None when a thinking block was
    opened and never closed (no final answer), including one opened again after
    the last ``</think>`` (``...</think> \\boxed{5} <think> maybe 6``)."""
    end, start = response.rfind(THINK_END), response.rfind(THINK_START)
    if start > end:
        return None
    return response[end + len(THINK_END) :] if end >= 0 else response
