"""Math and choice grader conformance: the tables in conformance/math.yaml and choice.yaml.

Each case's expected verdict is the official grader's (math-verify itself for math; the
simple-evals GPQA rule for choice), checked here against that grader too, unless the case
names a deliberate deviation (``policy``), which must be a row of the grading policy
(``relaxtune/graders/policy.yaml``)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from relaxtune.graders.choice import grade_choice
from relaxtune.graders.math import grade_math
from relaxtune.graders.policy import policies

HERE = Path(__file__).parent
MATH = yaml.safe_load((HERE / "conformance" / "math.yaml").read_text())["cases"]
CHOICE = yaml.safe_load((HERE / "conformance" / "choice.yaml").read_text())["cases"]
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _policies() -> set[str]:
    """The policy ids of the grading policy (``relaxtune/graders/policy.yaml``, the table the docs render)."""
    return {row["id"] for row in policies()}


def _math_verify_says(response: str, gold: str) -> bool:
    """math-verify on its own: the gold boxed unless it has $ or a box, the whole response parsed."""
    from math_verify import parse, verify

    gold_text = gold if ("$" in gold or "\\boxed" in gold) else f"\\boxed{{{gold}}}"
    return bool(
        verify(parse(gold_text, parsing_timeout=None), parse(response, parsing_timeout=None), timeout_seconds=None)
    )


def _simple_evals_reads(response: str, letters: str) -> str | None:
    """The simple-evals GPQA rule (``gpqa_eval.py``: ``re.search(ANSWER_PATTERN_MULTICHOICE, ...)``,
    ``common.py``: ``(?i)Answer[ \\t]*:[ \\t]*\\$?([A-D])\\$?``), its letter class widened to
    ``letters``: the first match anywhere; a lower-case letter it matches never equals the
    upper-case gold, so it counts as no answer."""
    match = re.search(rf"(?i)Answer[ \t]*:[ \t]*\$?([{letters}])\$?", response)
    return match.group(1) if match and match.group(1) in letters else None


@pytest.mark.parametrize("case", MATH, ids=[f"{i}:{c['response'][:40]}" for i, c in enumerate(MATH)])
def test_math_case(case):
    options = {"truncated": case.get("truncated", False)}
    if "integer_range" in case:
        options["integer_range"] = tuple(case["integer_range"])
    verdict = grade_math(case["response"], case["gold"], **options)
    assert verdict.verdict == case["verdict"], verdict
    official = _math_verify_says(case["response"], case["gold"])
    if "policy" in case:
        assert official != (case["verdict"] == "correct"), "math-verify agrees: not a deviation"
    else:
        assert official == (case["verdict"] == "correct"), "expected verdict differs from math-verify's"


@pytest.mark.parametrize("case", CHOICE, ids=[f"{i}:{c['response'][:40]}" for i, c in enumerate(CHOICE)])
def test_choice_case(case):
    letters = case.get("letters", "ABCD")
    gold = case["expect"] or letters[0]
    fmt = case.get("format", "ANSWER:")
    verdict = grade_choice(case["response"], {"answer": gold, "letters": letters, "format": fmt})
    assert verdict.extracted == case["expect"]
    assert verdict.verdict == ("correct" if case["expect"] else "no_answer")
    if case["expect"]:  # the same response graded against another letter is wrong
        other = next(x for x in letters if x != gold)
        assert grade_choice(case["response"], {"answer": other, "letters": letters, "format": fmt}).verdict == "wrong"
    official = _simple_evals_reads(case["response"], letters)
    if "policy" in case:
        assert official != case["expect"], "simple-evals agrees: not a deviation"
    else:
        assert official == case["expect"]


def test_tables_are_large_and_policies_documented():
    documented = _policies()
    used = {c["policy"] for c in MATH + CHOICE if "policy" in c}
    code = yaml.safe_load((HERE / "conformance" / "code.yaml").read_text())["cases"]
    used |= {c["policy"] for c in code if "policy" in c}
    assert used <= documented, f"policies missing from relaxtune/graders/policy.yaml: {used - documented}"
    assert documented - used <= {"special-judge"}, f"policies without a case: {documented - used - {'special-judge'}}"
    assert len(MATH) + len(CHOICE) + len(code) >= 300
    assert {c["verdict"] for c in MATH} == {"correct", "wrong", "no_answer"}
