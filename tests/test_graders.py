"""Graders on hand-written cases (the tables live in tests/conformance/)."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from relaxtune.graders import grade
from relaxtune.graders.choice import extract_choice
from relaxtune.graders.code import grade_code
from relaxtune.graders.math import grade_math, gsm8k_gold, last_boxed

# ----------------------------------------------------------------------- math


@pytest.mark.parametrize(
    "response, gold, verdict",
    [
        (r"so the answer is \boxed{\frac{1}{2^{98}}}", r"\frac{1}{2^{99}}", "wrong"),  # math-verify alone says equal
        (r"so the answer is \boxed{\frac{1}{2^{99}}}", r"\frac{1}{2^{99}}", "correct"),
        (r"\boxed{2}. wait, actually \boxed{3}", "3", "correct"),
        (r"\boxed{3}. hmm, no: \boxed{2}", "3", "wrong"),
        (r"We get \boxed{\frac{18}{14}}", r"\dfrac{9}{7}", "correct"),  # gold without $...$
        (r"<think>the sum is 42, I think</think> Final: \boxed{41}", "42", "wrong"),
        (r"<think>so it is 42", "42", "no_answer"),  # thinking never closed
        (r"\boxed{x^2 + 2x + 1}", "(x+1)^2", "correct"),
        ("The answer is 7.", "7", "correct"),  # finished response without a box: math-verify extraction
    ],
)
def test_math_cases(response, gold, verdict):
    assert grade_math(response, gold).verdict == verdict


def test_truncated_without_box_is_never_rescued():
    text = "Let me compute: 3 + 4 = 7, so the answer should be 7 but let me double check the"
    assert grade_math(text, "7", truncated=True).verdict == "no_answer"
    assert grade_math(text + r" ... \boxed{7}", "7", truncated=True).correct


def test_aime_integer_range():
    assert grade_math(r"\boxed{204}", "204", integer_range=(0, 999)).correct
    assert grade_math(r"\boxed{1204}", "1204", integer_range=(0, 999)).verdict == "wrong"
    assert grade_math(r"\boxed{\frac{1}{2}}", "1", integer_range=(0, 999)).detail == "not an integer"


def test_gold_helpers():
    assert gsm8k_gold("rationale\n#### 1,000") == "1000"
    assert last_boxed(r"a \boxed{\frac{1}{2}} b \boxed{x_{1}}") == "x_{1}"
    with pytest.raises(ValueError, match="does not parse"):
        from relaxtune.graders.math import parse_gold

        parse_gold("")


def test_math_grading_in_a_thread_pool():
    cases = [(rf"\boxed{{{i}/2}}", f"{i / 2}" if i % 2 else str(i // 2)) for i in range(1, 13)]
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda c: grade_math(*c), cases))
    assert [v.verdict for v in verdicts] == ["correct"] * 12


# --------------------------------------------------------------------- choice


def test_choice_anchor_beats_letter_in_boxed_formula():
    text = r"Using \boxed{E = mc^2} and option B's argument... Answer: D"
    assert extract_choice(text) == "D"
    assert grade("choice", text, "D").correct


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is (C).", "C"),
        ("ANSWER: b", None),  # letters are upper-case only (simple-evals compares with the upper-case gold)
        (r"Therefore \boxed{A}", "A"),
        (r"Therefore \boxed{\text{C}}", "C"),
        ("A careful analysis shows B is tempting but I cannot determine the answer.", None),
        ("Option A looks right.", None),  # a stray letter is not an answer
        ("The answer is (A). Wait, the answer is (C).", "C"),
    ],
)
def test_choice_extraction(text, expected):
    assert extract_choice(text) == expected


def test_cannot_determine_is_no_answer():
    v = grade("choice", "This cannot be determined from the data.", "A")
    assert v.verdict == "no_answer" and v.detail == "refused"


# ----------------------------------------------------------------------- code

HE = {
    "prompt": 'from typing import List\n\n\ndef add(xs: List[int], k: int) -> List[int]:\n    """add k"""\n',
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate([1, 2], 3) == [4, 5]\n    assert candidate([], 1) == []\n",
}
GOOD = "```python\ndef add(xs, k):\n    return [x + k for x in xs]\n```"
# Early exits, equality hacks, escapes, floods and the official semantics: tests/conformance/code.yaml


def test_sandbox_has_no_network():
    import socket

    with socket.socket() as server:  # a listener the solution could reach with network access
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        body = (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "def add(xs, k):\n    return [x + k for x in xs]")
        v = grade_code(f"```python\n{body}\n```", HE, timeout=2)
        assert v.verdict == "runtime_error", v.detail
        with pytest.raises(socket.timeout):
            server.accept()  # nobody connected


def test_stdin_and_functional_tests():
    stdin = {"tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"}]}
    assert grade_code("```python\na, b = map(int, input().split())\nprint(a + b)\n```", stdin).verdict == "pass"
    assert grade_code("```python\nprint(3)\n```", stdin).verdict == "wrong_answer"
    fn = {"tests": [{"input": "[1, 2]\n3", "output": "[4, 5]"}], "fn_name": "addK"}
    sol = "```python\nclass Solution:\n    def addK(self, nums, k):\n        return [x + k for x in nums]\n```"
    assert grade_code(sol, fn).verdict == "pass"
    assert grade_code("no code here", fn).verdict == "no_answer"
    assert grade_code(GOOD, {"tests": [{"input": "", "output": ""}], "fn_name": 3}).verdict != "pass"


def test_code_verdicts_do_not_depend_on_parallelism():
    bodies = ["def add(xs, k):\n    return [x + k for x in xs]", "def add(xs, k):\n    return xs",
              "while True:\n    pass", "def add(xs, k):\n    raise ValueError"] * 2
    responses = [f"```python\n{b}\n```" for b in bodies]
    serial = [grade_code(r, HE, timeout=1).verdict for r in responses]
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(lambda r: grade_code(r, HE, timeout=1).verdict, responses))
    assert serial == parallel == ["pass", "wrong_answer", "time_limit", "runtime_error"] * 2
