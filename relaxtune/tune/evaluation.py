"""Evaluate one decoding configuration on one task: generate, grade, record.

Per-sample records are appended to a JSONL file as each sample is graded, so a
killed run keeps every finished sample and a restart skips them. Generation is
batched when the backend can (``BatchBackend``, the in-process models: up to
``batch_size`` samples advance together, finished ones make room for the next;
``relaxtune.engine.responses.generate_responses``), else ``backend.max_concurrency``
sequences run in threads (servers that batch on their side). Grading runs in
a thread pool meanwhile (the math grader is thread-safe, code runs in
sandboxed processes). A sample whose generation fails is recorded as failed and
left out of the accuracy, never dropped or counted as wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator

from ..backends.base import Backend, is_batched
from ..certify.stats import wilson_interval
from ..engine.responses import generate_response, generate_responses
from ..engine.sequence import Generation, check_decode, native_server
from ..graders import Verdict, grade
from ..graders.base import THINK_START, answer_section
from ..tasks.spec import Problem, TaskSpec, build_prompt_ids, load_problems
from .stopping import check_stop

__all__ = ["DecodeConfig", "EvalResult", "evaluate", "sample_seed", "generate_response", "records_path",
           "opens_thinking"]




@dataclass(frozen=True)
class DecodeConfig:
    """A point to evaluate: method, knob (alpha), draft length N, base seed."""

    method: str = "strict"
    knob: float | None = None
    n_draft: int = 4
    seed: int = 0

    @property
    def label(self) -> str:
        """File-name-safe label, e.g. ``cactus-1__N4__seed0``."""
        knob = "" if self.knob is None else f"-{self.knob:g}"
        return f"{self.method}{knob}__N{self.n_draft}__seed{self.seed}"


@dataclass
class EvalResult:
    """Aggregate of one evaluation.

    Attributes:
        accuracy: correct / graded samples; ``ci_low``/``ci_high``: its 95 % Wilson interval.
        n: graded samples; failed: samples whose generation failed.
        l_accept: accepted drafts per round over all samples (tokens).
        mean_length: mean response length (tokens), ``L``.
        truncated: share of responses that hit the token budget.
        tokens_per_second: response tokens per wall second of generation.
        tokens: model tokens generated (response tokens).
        records: the per-sample records (dicts), in problem order.
        path: the JSONL file.
    """

    accuracy: float
    ci_low: float
    ci_high: float
    n: int
    failed: int
    l_accept: float
    mean_length: float
    truncated: float
    tokens_per_second: float
    tokens: int
    records: list[dict]
    path: Path

    def summary(self) -> dict:
        """Everything but the records, JSON-ready."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("records", "path")} | {
            "path": str(self.path)
        }


def sample_seed(base: int, problem_id: str, repeat: int) -> int:
    """The seed of one sample: the same for every method (common random numbers)."""
    return zlib.crc32(f"{base}:{problem_id}:{repeat}".encode())


def records_path(output_dir: Path, spec: TaskSpec, config: DecodeConfig, backend_name: str) -> Path:
    """``<output_dir>/<task>-v<version>/<pair>/<config label>.jsonl``."""
    pair = "".join(c if c.isalnum() or c in "-._" else "_" for c in backend_name)
    return Path(output_dir) / f"{spec.name}-v{spec.version}" / pair / f"{config.label}.jsonl"


def records_name(backend, method: str) -> str:
    """The name a backend's records are kept under for ``method``: its ``name``, with
    ``+native`` when SGLang's own speculative server runs it (other samples than the
    client-loop transcription)."""
    name = getattr(backend, "name", "backend")
    return name + "+native" if native_server(backend, method) is not None else name


def finished_samples(output_dir: Path, spec: TaskSpec, config: DecodeConfig, backend_name: str,
                     problems: list[Problem]) -> int:
    """How many (problem, repeat) of ``problems`` already have a finished record (samples)."""
    done = _read_done(records_path(Path(output_dir), spec, config, backend_name))
    return sum((p.id, r) in done for p in problems for r in range(spec.repeats))


def records_complete(output_dir: Path, spec: TaskSpec, config: DecodeConfig, backend_name: str,
                     problems: list[Problem]) -> bool:
    """True when every (problem, repeat) of ``problems`` has a finished record."""
    return finished_samples(output_dir, spec, config, backend_name, problems) == len(problems) * spec.repeats


def check_spec_unchanged(task_dir: Path, spec: TaskSpec) -> None:
    """Record the task spec in ``<task_dir>/spec.json`` on first use; later, refuse
    a spec that differs, so records of an edited task are never silently reused.

    Raises:
        ValueError: naming the changed fields and the fix (bump ``version``).
    """
    now = json.loads(spec.model_dump_json())
    file = Path(task_dir) / "spec.json"
    if not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f"spec.json.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(now, indent=2))
        os.replace(tmp, file)  # atomic: a concurrent reader sees all or nothing
        return
    before = json.loads(file.read_text())
    try:  # through the schema: fields added since (with their defaults) are no change
        before = json.loads(TaskSpec(**before).model_dump_json())
    except (ValueError, TypeError):
        pass
    changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k) and k != "description")
    if changed:
        raise ValueError(f"task {spec.name} v{spec.version} changed since its records in {file.parent} were written "
                         f"({', '.join(changed)}): bump `version:` in its YAML, or use another --output-dir")


def opens_thinking(tokenizer, prompt_ids: list[int]) -> bool:
    """Whether the prompt leaves a thinking block open (the chat templates of
    DeepSeek-R1 distills and QwQ end with ``<think>``): the response then starts
    inside it, and is graded as ``<think>`` + response, so a response that never
    closes it has no answer and nothing inside it is graded."""
    return answer_section(tokenizer.decode(list(prompt_ids[-16:]))) is None


def _grade(spec: TaskSpec, problem: Problem, text: str, truncated: bool) -> Verdict:
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


_DONE: dict[Path, tuple[tuple[int, int], int, dict]] = {}  # path -> (file id, bytes parsed, finished records)
_DONE_LOCK = threading.Lock()


def _read_done(path: Path) -> dict[tuple[str, int], dict]:
    """Finished records of a JSONL file by (problem id, repeat). Files only grow
    (appends), so each call parses just the lines added since the last one: a
    study's stages re-read nothing. A replaced or shorter file is read anew."""
    path = Path(path).resolve()
    try:
        st = path.stat()
    except FileNotFoundError:
        return {}
    with _DONE_LOCK:
        ident, offset, done = _DONE.get(path, (None, 0, {}))
        if ident != (st.st_dev, st.st_ino) or st.st_size < offset:
            offset, done = 0, {}
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a trailing partial line waits for its end
        for line in complete.decode().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: redo that sample
                continue
            if rec.get("failed"):  # a failed generation is tried again on resume
                continue
            done[(rec["problem_id"], rec["repeat"])] = rec
        _DONE[path] = ((st.st_dev, st.st_ino), offset + len(complete), done)
        return dict(done)


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
        ValueError: bad method/knob for this task's sampling, or a task spec that
            changed under the same version (before any generation).
    """
    check_decode(config.method, config.knob, config.n_draft, spec.sampling.temperature)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    problems = problems if problems is not None else load_problems(spec, limit)
    path = records_path(Path(output_dir), spec, config, records_name(backend, config.method))
    check_spec_unchanged(path.parent.parent, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _read_done(path)
    todo = [(p, r) for p in problems for r in range(spec.repeats) if (p.id, r) not in done]

    bar = None
    if progress and todo:  # a bar on a terminal, plain lines in a pipe or a log
        from .progress import progress as progress_bar

        from .progress import prior_length

        bar = progress_bar(len(todo), f"{spec.name} {config.label}",
                           length=prior_length(path.parent, spec.max_new_tokens)[0])
    prompts = {p.id: build_prompt_ids(backend.tokenizer, spec, p) for p, _ in todo}
    items = [((p, r), prompts[p.id], sample_seed(config.seed, p.id, r)) for p, r in todo]
    pending: list[tuple[dict, Future | None]] = []  # records wait for their verdicts, in generation order

    def flush(wait: bool) -> None:
        while pending and (wait or pending[0][1] is None or pending[0][1].done()):
            record, verdict = pending.pop(0)
            if verdict is not None:
                v = verdict.result()
                record.update(extracted=v.extracted, verdict=v.verdict, correct=v.correct, grader_detail=v.detail)
            out.write((json.dumps(record) + "\n").encode())
            done[(record["problem_id"], record["repeat"])] = record
            if bar is not None:
                bar.update(1, record.get("response_tokens"))

    # grading overlaps with generation; records are written in generation order, each
    # in one unbuffered write to the O_APPEND file, so records of several workers
    # appending to the same file never interleave
    opens = {p.id: opens_thinking(backend.tokenizer, prompts[p.id]) for p, _ in todo}
    with ThreadPoolExecutor(grade_workers) as graders, open(path, "ab", buffering=0) as out:
        def on_tokens(n: int) -> None:  # after every round: progress, and a stop asked for in another thread
            check_stop()
            if bar is not None:
                bar.add_tokens(n)

        try:
            for (problem, repeat), gen in _responses(backend, spec, config, items, batch_size, on_tokens):
                prompt_ids = prompts[problem.id]
                record = dict(
                    task=spec.name, version=spec.version, problem_id=problem.id, repeat=repeat,
                    seed=sample_seed(config.seed, problem.id, repeat),
                    prompt_hash=hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:16],
                    method=config.method, knob=config.knob, n_draft=config.n_draft, prompt_tokens=len(prompt_ids),
                )
                if isinstance(gen, Exception):  # recorded as failed, never as wrong
                    record.update(failed=True, error=f"{type(gen).__name__}: {gen}", verdict="generation_error",
                                  correct=None)
                    pending.append((record, None))
                else:
                    record.update(failed=False, output=gen.text, finish_reason=gen.stats.finish_reason,
                                  response_tokens=gen.stats.response_tokens, stats=gen.stats.to_dict())
                    if "missing_mass" in gen.extra:
                        record["max_missing_mass"] = max(gen.extra["missing_mass"], default=0.0)
                    if "cached_tokens" in gen.extra:
                        record["cached_tokens"] = gen.extra["cached_tokens"]
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


def _responses(backend, spec: TaskSpec, config: DecodeConfig, items: list, batch_size: int | None,
               on_tokens=None) -> Iterator[tuple[object, Generation | Exception]]:
    """``(key, Generation or exception)`` per item ``(key, prompt_ids, seed)``:
    batched on a ``BatchBackend`` (in the order samples end; ``on_tokens(n)`` after
    every round), else ``max_concurrency`` threads of ``generate_response`` (in item
    order; ``on_tokens`` as each response ends)."""
    if not items:  # every sample recorded: the backend is not touched (a lazy one is never loaded)
        return
    if is_batched(backend):
        yield from generate_responses(backend, spec, config, items, batch_size, on_tokens=on_tokens)
        return

    def one(prompt_ids: list[int], seed: int) -> Generation | Exception:
        try:
            gen = generate_response(backend, spec, prompt_ids, config, seed)
        except Exception as err:  # noqa: BLE001 - recorded as failed
            return err
        if on_tokens is not None:
            on_tokens(gen.stats.response_tokens)
        return gen

    concurrency = max(1, int(getattr(backend, "max_concurrency", 1)))
    pool = ThreadPoolExecutor(concurrency)
    try:
        jobs = [(key, ids, pool.submit(one, ids, seed)) for key, ids, seed in items]
        for key, _, job in jobs:
            yield key, job.result()
    finally:  # a stop: the requests not sent yet are dropped
        pool.shutdown(wait=False, cancel_futures=True)


def summarize(records: list[dict], path: Path) -> EvalResult:
    """Aggregate per-sample records into an ``EvalResult``."""
    graded = [r for r in records if not r.get("failed")]
    k = sum(1 for r in graded if r.get("correct"))
    n = len(graded)
    lo, hi = wilson_interval(k, n)
    rounds = sum(r["stats"]["rounds"] for r in graded)
    accepted = sum(r["stats"]["accepted"] for r in graded)
    tokens = sum(r["response_tokens"] for r in graded)
    wall = sum(r["stats"]["wall_seconds"] for r in graded)
    return EvalResult(
        accuracy=k / n if n else 0.0, ci_low=lo, ci_high=hi, n=n, failed=len(records) - n,
        l_accept=accepted / rounds if rounds else 0.0, mean_length=tokens / n if n else 0.0,
        truncated=sum(1 for r in graded if r["finish_reason"] == "length") / n if n else 0.0,
        tokens_per_second=tokens / wall if wall else 0.0, tokens=tokens, records=records, path=path,
    )
