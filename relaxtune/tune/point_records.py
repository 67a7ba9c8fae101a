"""A point to evaluate and its records on disk.

A point (``DecodeConfig``: method, knobs, draft length, seed, relaxation scope) keeps
its per-sample records in one JSONL file, ``records_path``:
``<output_dir>/<task>-v<version>/<pair>/<config label>.jsonl``, under the pair's
``records_name``. The file only grows (``relaxtune.tune.evaluation`` appends each
sample as it is graded), and is read incrementally: a failed sample, a line cut by a
kill or a record that does not validate is not finished, and is generated again.
``finished_samples`` and ``records_complete`` say how much of a point is already
there; ``check_spec_unchanged`` refuses records of a task edited under the same
version. ``summarize`` aggregates records into an ``EvalResult``.

Records know the code that made them (``relaxtune.tune.identity``): each holds
``grader`` and ``decoder``, the identities of the graders and of the decoding
core (``record_identity``). ``current_records`` tells the records made by this code
from those to grade again (other grader code) and those to generate again (another
decoding core, or no identity: written before records kept it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, fields
from pathlib import Path

from ..certify.stats import wilson_interval
from ..engine.sequence import native_server
from ..tasks.spec import Problem, TaskSpec
from .identity import decoding_identity, grader_identity
from .records import RecordError, SampleRecord, Scope, knobs_of, load_record

__all__ = [
    "DecodeConfig",
    "EvalResult",
    "summarize",
    "records_path",
    "records_name",
    "finished_samples",
    "records_complete",
    "check_spec_unchanged",
    "record_identity",
    "current_records",
    "finished_records",
    "SCOPE_PARAM",
    "trial_scope",
]

SCOPE_PARAM = "scope"  # a trial's relaxation scope parameter (a job whose --relaxation-scope is not all)


def trial_scope(params: dict) -> Scope:
    """A trial's relaxation scope from its parameters (``"all"`` for a trial without one:
    every trial of a job of scope all, and of jobs before the scope)."""
    return params.get(SCOPE_PARAM, "all")


_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeConfig:
    """A point to evaluate: method, knob (alpha), draft length N, base seed, the
    relaxation scope (``relaxtune.tune.records``: "all", or "thinking" only) and the
    further named knobs that differ from alpha's view (``extra``: ``((engine name,
    value), ...)`` in declared order, ``MethodSpec.extra_of``; empty for the paper's
    one-knob rules and for a point at the alpha view)."""

    method: str = "strict"
    knob: float | None = None
    n_draft: int = 4
    seed: int = 0
    scope: Scope = "all"
    extra: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of_point(cls, method: str, params: dict, seed: int, scope: Scope = "all") -> DecodeConfig:
        """The point of a study's trial parameters (``knob``, ``n_draft`` and each further
        knob under its engine name; ``relaxtune.tune.search``), normalised: further knobs
        at the alpha view's values are left out, so the point keeps that view's records.

        Raises:
            ValueError: a further knob outside its range.
        """
        from ..decoding.methods import get_method

        knob, n = params.get("knob"), params["n_draft"]
        extra = () if knob is None else get_method(method).extra_of(knob, params, n)
        return cls(method, knob, n, seed, scope, extra)

    @property
    def point_knob(self) -> float | dict | None:
        """What the decoding core takes: alpha, or every named knob when ``extra`` is set."""
        if not self.extra:
            return self.knob
        from ..decoding.methods import get_method

        return get_method(self.method).point_knobs(self.knob, self.extra)

    @property
    def knobs(self) -> dict[str, float]:
        """The point's named knobs (``{registry knob name: knob}``, ``{}`` without one)."""
        return knobs_of(self.method, self.point_knob)

    @property
    def label(self) -> str:
        """File-name-safe label, e.g. ``cactus-1__N4__seed0`` (``__thinking`` after it for
        that scope: the records of scope "all" keep the file names of v2); each further
        knob follows alpha as ``+<engine name>=<value>``."""
        knob = "" if self.knob is None else f"-{self.knob:g}"
        knob += "".join(f"+{name}={value:g}" for name, value in self.extra)
        scope = "" if self.scope == "all" else f"__{self.scope}"
        return f"{self.method}{knob}__N{self.n_draft}__seed{self.seed}{scope}"


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


def record_identity() -> dict[str, str]:
    """The code identity every new record carries: ``{"grader", "decoder"}``."""
    return {"grader": grader_identity(), "decoder": decoding_identity()}


def current_records(done: dict[tuple[str, int], SampleRecord]) -> tuple[dict, dict, dict]:
    """Split finished records (by key) into ``(current, regrade, regenerate)``: made by
    this code; generated by this decoding core but graded by other grader code; or
    generated by another decoding core (or by code that kept no identity)."""
    me = record_identity()
    regenerate = {k: r for k, r in done.items() if r.decoder != me["decoder"]}
    regrade = {k: r for k, r in done.items() if k not in regenerate and r.grader != me["grader"]}
    current = {k: r for k, r in done.items() if k not in regenerate and k not in regrade}
    return current, regrade, regenerate


_DONE: dict[Path, tuple[tuple[int, int], int, dict]] = {}  # path -> (file id, bytes parsed, finished SampleRecords)
_DONE_LOCK = threading.Lock()


def finished_records(path: Path) -> dict[tuple[str, int], SampleRecord]:
    """Finished records of a JSONL file by (problem id, repeat), schema v2 or v3
    (``relaxtune.tune.records.load_record``). Files only grow
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
        for number, line in enumerate(complete.decode().splitlines()):
            try:
                rec = load_record(json.loads(line), where=f"{path} (line {number + 1} after byte {offset})")
            except (json.JSONDecodeError, RecordError) as err:  # a line cut by a kill: redo that sample
                if isinstance(err, RecordError):
                    _log.warning("%s: generating that sample again", err)
                continue
            if rec.failed:  # a failed generation is tried again on resume
                continue
            done[rec.key] = rec
        _DONE[path] = ((st.st_dev, st.st_ino), offset + len(complete), done)
        return dict(done)


def finished_samples(
    output_dir: Path, spec: TaskSpec, config: DecodeConfig, backend_name: str, problems: list[Problem]
) -> int:
    """How many (problem, repeat) of ``problems`` already have a finished record (samples)
    generated by this decoding core (one graded by other grader code is graded again
    when read, without generating)."""
    current, regrade, _ = current_records(finished_records(records_path(Path(output_dir), spec, config, backend_name)))
    done = current | regrade
    return sum((p.id, r) in done for p in problems for r in range(spec.repeats))


def records_complete(
    output_dir: Path, spec: TaskSpec, config: DecodeConfig, backend_name: str, problems: list[Problem]
) -> bool:
    """True when every (problem, repeat) of ``problems`` has a finished record."""
    return finished_samples(output_dir, spec, config, backend_name, problems) == len(problems) * spec.repeats


def check_spec_unchanged(task_dir: Path, spec: TaskSpec, *, record: bool = True) -> None:
    """Record the task spec in ``<task_dir>/spec.json`` on first use; later, refuse
    a spec that differs, so records of an edited task are never silently reused.
    ``record=False`` only checks (a job's start, before anything loads: a job
    refused later leaves no file); the first record written records the spec.

    Raises:
        ValueError: naming the changed fields and the fix (bump ``version``).
    """
    now = json.loads(spec.model_dump_json())
    file = Path(task_dir) / "spec.json"
    if not file.exists():
        if not record:
            return
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
        raise ValueError(
            f"task {spec.name} v{spec.version} changed since its records in {file.parent} were written "
            f"({', '.join(changed)}): bump `version:` in its YAML, or use another --output-dir"
        )


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
        records: the per-sample records (``SampleRecord.dump`` dicts), in problem order.
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


def summarize(records: list[dict | SampleRecord], path: Path) -> EvalResult:
    """Aggregate per-sample records (``SampleRecord``s or their dicts) into an ``EvalResult``
    (its ``records`` are dicts)."""
    records = [r.dump() if isinstance(r, SampleRecord) else r for r in records]
    graded = [r for r in records if not r.get("failed")]
    k = sum(1 for r in graded if r.get("correct"))
    n = len(graded)
    lo, hi = wilson_interval(k, n)
    rounds = sum(r["stats"]["rounds"] for r in graded)
    accepted = sum(r["stats"]["accepted"] for r in graded)
    tokens = sum(r["response_tokens"] for r in graded)
    wall = sum(r["stats"]["wall_seconds"] for r in graded)
    return EvalResult(
        accuracy=k / n if n else 0.0,
        ci_low=lo,
        ci_high=hi,
        n=n,
        failed=len(records) - n,
        l_accept=accepted / rounds if rounds else 0.0,
        mean_length=tokens / n if n else 0.0,
        truncated=sum(1 for r in graded if r["finish_reason"] == "length") / n if n else 0.0,
        tokens_per_second=tokens / wall if wall else 0.0,
        tokens=tokens,
        records=records,
        path=path,
    )
