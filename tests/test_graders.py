"""Graders on hand-written cases (the tables live in tests/conformance/)."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from relaxtune.graders import grade
from relaxtune.graders import math as math_grader
from relaxtune.graders.choice import extract_choice, prompt_answer_format
from relaxtune.graders.code import extract_code, grade_code, special_judge_reason
from relaxtune.graders.math import grade_math, gsm8k_gold, last_boxed, scan_boxes
from relaxtune.graders.workers import WorkerPool

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
        from relaxtune.graders.mathcheck import parse_gold

        parse_gold("")


def _math_workers() -> set[int]:
    """Process ids of this process's children running the math-verify worker."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == os.getpid() and b"mathcheck.py" in cmdline:
            found.add(int(entry))
    return found


def test_a_runaway_evaluation_is_stopped_at_the_deadline_and_blocks_no_one():
    runaway = r"\boxed{10^{10^{10}}}"  # sympy would compute a ten-billion-digit integer, holding the GIL
    with ThreadPoolExecutor(3) as pool:
        slow = pool.submit(grade_math, runaway, "5", timeout=2)
        quick = list(pool.map(lambda i: grade_math(rf"\boxed{{{i}}}", str(i)), range(6)))
        verdict = slow.result()
    assert [v.verdict for v in quick] == ["correct"] * 6
    assert verdict.verdict == "grader_error" and "no answer within 2 s" in verdict.detail
    assert _math_workers() == {w.proc.pid for w in math_grader._POOL._idle}  # the stopped worker is gone


def test_a_forked_process_grades_with_workers_of_its_own():
    assert grade_math(r"\boxed{5}", "5").correct  # the parent has an idle worker now
    pid = os.fork()
    if pid == 0:  # a copy that reused the parent's worker would garble both conversations
        ok = False
        try:
            ok = grade_math(r"\boxed{6}", "6").correct and grade_math(r"\boxed{6}", "7").verdict == "wrong"
        finally:
            os._exit(0 if ok else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert [grade_math(rf"\boxed{{{i}}}", str(i)).correct for i in range(3)] == [True] * 3


def test_math_grading_in_a_process_with_many_open_descriptors():
    """A long-running job (MLflow, Prefect) holds many files: the worker's pipes pass FD_SETSIZE."""
    script = (
        "import os, resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (2048, 2048))\n"
        "held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]\n"
        "from relaxtune.graders.math import grade_math\nprint(grade_math(r'\\boxed{5}', '5').verdict)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent
    )
    assert run.stdout.strip() == "correct", run.stderr[-2000:]


def test_worker_pool_says_why_a_worker_failed(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('math-verify is not installed')\n")
    with pytest.raises(RuntimeError, match="did not start .*math-verify is not installed"):
        WorkerPool(broken, size=1).ask({}, 5)
    dies = tmp_path / "dies.py"
    dies.write_text("import os, sys\nprint('ready', flush=True)\nsys.stdin.readline()\nos._exit(3)\n")
    with pytest.raises(RuntimeError, match="ended without an answer .exit status 3"):
        WorkerPool(dies, size=1).ask({"x": 1}, 5)


def test_boxes_are_found_in_one_pass():
    closed, unclosed = scan_boxes(r"a \boxed{\boxed{1}} b \boxed{\{2\}} c \fbox{3} d \boxed{4")
    assert closed == [(2, r"\boxed{1}"), (9, "1"), (22, r"\{2\}"), (38, "3")] and unclosed == [49]
    degenerate = r"\boxed{" * 200_000  # a looping model; quadratic scanning would take hours
    assert grade_math(degenerate, "5", truncated=True).detail == r"truncated inside its last \boxed{}"
    assert extract_choice(degenerate + "ANSWER: C") == "C"


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


@pytest.mark.parametrize(
    "template, prefix",
    [
        (
            "The last line of your response should be of the form 'ANSWER: $LETTER' (without quotes) "
            "where LETTER is one "
            "of ABCD.",
            "ANSWER:",
        ),
        ("...of the following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD.", "Answer:"),
        ('Your final line must be "FINAL: X" where X is A, B, C or D.', "FINAL:"),
        ('End with "Final answer: <letter>".', "Final answer:"),
        ('Reply in the format "Choice: [LETTER]".', "Choice: ["),
        ('finish your answer with "the answer is (X)" where X is the correct letter choice.', "the answer is ("),
        ('Use the tag "X-ray" if needed. Answer with the letter only.', None),
        ('Let "x = X" denote the unknown.', None),
        ("Put the letter in \\boxed{}.", None),
    ],
)
def test_the_prompts_own_answer_format_is_found(template, prefix):
    assert prompt_answer_format(template) == prefix


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


def test_fences_are_read_in_linear_time():
    assert extract_code("```" * 100_000) is None  # a looping model; a backtracking fence pattern takes hours
    rambling = "~~~~\n" + "```\n" * 100_000 + "```python\nx = 1\n```"
    assert extract_code(rambling) == "x = 1\n"  # the tilde fence never closed is text


@pytest.mark.parametrize(
    "statement",
    [
        "If there are multiple solutions, print any of them.",
        "If there are multiple possible strings, print any one.",
        "If multiple solutions exist, any of them will be accepted.",
        "You may return the answer in any order.",
        "You can output the edges in any order.",
        "Any valid answer will be accepted.",
        "It is guaranteed that a solution exists. If there are multiple solutions, you may print any one of them.",
        "Your output will be judged correct if the absolute or relative error from the true answer is at most 10^{-6}.",
        "Your answer is considered correct if its absolute or relative error does not exceed 10^{-9}.",
        "Your answer will be considered correct if the absolute error is at most 10^{-6}.",
    ],
)
def test_special_judge_statements_are_detected(statement):
    assert special_judge_reason(statement) is not None


@pytest.mark.parametrize(
    "statement",
    [
        "If there are multiple answers, print the one with the smallest index.",
        "If there are multiple such x, print the smallest one.",
        "Print Yes if any of them is correct, and No otherwise.",
        "Determine whether any of them is accepted by the machine.",
        "Do not print any extra spaces.",
        "If there is no solution, print -1.",
        "Print the lexicographically smallest string among them.",
        "Return the number of subarrays in which any element appears at least twice.",
        "Print the answer rounded to exactly 6 decimal places.",
        "The edges are given in any order. Print the number of components.",
    ],
)
def test_single_answer_statements_are_kept(statement):
    assert special_judge_reason(statement) is None


def test_sandbox_has_no_network():
    import socket

    with socket.socket() as server:  # a listener the solution could reach with network access
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        body = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "def add(xs, k):\n    return [x + k for x in xs]"
        )
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
    bodies = [
        "def add(xs, k):\n    return [x + k for x in xs]",
        "def add(xs, k):\n    return xs",
        "while True:\n    pass",
        "def add(xs, k):\n    raise ValueError",
    ] * 2
    responses = [f"```python\n{b}\n```" for b in bodies]
    serial = [grade_code(r, HE, timeout=1).verdict for r in responses]
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(lambda r: grade_code(r, HE, timeout=1).verdict, responses))
    assert serial == parallel == ["pass", "wrong_answer", "time_limit", "runtime_error"] * 2
