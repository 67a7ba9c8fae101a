"""Typed sample records and point metrics (schema v3), and the v2 loader.

Two records cross storage, and each is defined here once:

- ``SampleRecord``: one graded (or failed) sample, one JSON line of a records file
  (``relaxtune.tune.point_records``: ``<output_dir>/<task>-v<version>/<pair>/<label>.jsonl``).
- ``PointMetrics``: one evaluated point against strict at the same draft length
  (``relaxtune.tune.judge.point_metrics``), the ``metrics`` user attribute of an Optuna
  trial (``relaxtune.tune.tuning``) and what the export reads back.

Schema v3 carries, beside every v2 field (same names, same order, same values): ``schema``
(3, first), the point's ``knobs`` as a mapping of named knobs (``{"delta": 10.0}`` for a
single-knob rule; several for rules with several, e.g. SGLang's
``{"speculative_accept_threshold_single": 0.9, "speculative_accept_threshold_acc": 0.5}``;
``{}`` for knob-less rules), its relaxation ``scope`` (``"all"``: every position is
verified by the rule; ``"thinking"``: only inside the thinking segment, strict in the
answer) and, in point metrics, the serving ``batch_size`` its speed-up is modeled at
(1: one sequence at a time, the only one measured before the per-batch cost profiles).

Version 2 (no ``schema`` key: records and metrics written before v3) loads through
``load_record`` / ``load_metrics``: its knobs are the method's one knob named by the
registry (``relaxtune.decoding.methods``) with the record's ``knob`` value, its scope
``"all"`` and its batch size 1, which is what every v2 run measured. Nothing is rewritten
on disk: a v2 file keeps its lines, and new lines appended to it are v3.

Errors: ``RecordError`` (a ``ValueError``) names the file and line or the trial of a
record that does not validate.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer

__all__ = [
    "RECORDS_SCHEMA",
    "SCOPES",
    "Scope",
    "RecordError",
    "SampleRecord",
    "PointMetrics",
    "knobs_of",
    "knob_of",
    "load_record",
    "load_metrics",
    "trial_metrics",
    "metrics_attr",
    "point_values",
]

RECORDS_SCHEMA = 3  # 3: schema, knobs (named), scope; metrics also batch_size. 2: no schema key
SCOPES = ("all", "thinking")
Scope = Literal["all", "thinking"]


class RecordError(ValueError):
    """A record or a point's metrics that does not match its schema (the message says where)."""


def knobs_of(method: str, knob: float | Mapping | None) -> dict[str, float]:
    """The named knobs of a point given its one v2 knob value (the alpha view): the
    registry's ``MethodSpec.named`` (SGLang's threshold ``t`` is both of its named
    thresholds), ``{}`` when ``knob`` is None; or given every named knob (a mapping,
    validated). A derived knob left to the engine (FLy's W at None) is left out. A method the registry no longer has, or
    one with no knob, keeps its value under ``"knob"``."""
    if knob is None:
        return {}
    from ..decoding.methods import ALL_METHODS

    spec = ALL_METHODS.get(method)
    if spec is None or not spec.knob_names:
        return {"knob": float(knob)}
    if isinstance(knob, Mapping):  # every named knob of a point (``DecodeConfig.knobs``)
        named = spec.check_knob(knob)
    else:
        named = spec.named(float(knob))
    return {name: float(value) for name, value in named.items() if value is not None}  # None: the engine derives it


def knob_of(knobs: Mapping[str, float]) -> float | None:
    """The one float a v2 reader expects (``DecodeConfig.knob``, a study's ``knob``
    parameter): the only knob's value, None for none.

    Raises:
        RecordError: several knobs (a v2 reader cannot take them).
    """
    if len(knobs) > 1:
        raise RecordError(f"a point with several knobs ({', '.join(knobs)}) has no single knob value")
    return next(iter(knobs.values()), None)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SampleRecord(_Record):
    """One sample, as its records file holds it. Field order is the file's.

    Attributes:
        schema: 3. task, version: the task and its version. problem_id, repeat: the sample.
        seed: its seed (``relaxtune.tune.evaluation.sample_seed``). prompt_hash: sha256 (16 hex)
            of the prompt ids. method, knob, n_draft: the point (``knob``: the v2 single value,
            kept; ``knobs``: every named knob). scope: relaxation scope. prompt_tokens: prompt
            length (tokens). grader, decoder: code identities (``relaxtune.tune.identity``).
        failed: the generation failed (then ``error``; never counted as wrong).
        output, finish_reason ("stop", "length", ...), response_tokens (tokens), stats
            (``GenerationStats.to_dict``: ``rounds``, ``accepted`` counts, seconds, ...).
        max_missing_mass, cached_tokens: what some backends add.
        extracted, verdict, correct, grader_detail: the grader's verdict.
    """

    schema_: int = Field(RECORDS_SCHEMA, alias="schema")
    task: str | None = None
    version: int | None = None
    problem_id: str
    repeat: int = 0
    seed: int | None = None
    prompt_hash: str | None = None
    method: str | None = None
    knob: float | None = None
    n_draft: int | None = None
    knobs: dict[str, float] = {}
    scope: Scope = "all"
    prompt_tokens: int | None = None
    grader: str | None = None
    decoder: str | None = None
    failed: bool = False
    error: str | None = None
    output: str | None = None
    finish_reason: str | None = None
    response_tokens: int | None = None
    stats: dict[str, Any] | None = None
    max_missing_mass: float | None = None
    cached_tokens: list[int] | None = None  # per round: the prefix a server found in its cache
    extracted: Any = None
    verdict: str | None = None
    correct: bool | None = None
    grader_detail: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("stats")
    @classmethod
    def _counts(cls, stats: dict | None) -> dict | None:
        """A finished sample's stats carry its round and accepted-draft counts."""
        if stats is not None:
            for key in ("rounds", "accepted"):
                if not isinstance(stats.get(key), int):
                    raise ValueError(f"stats.{key} must be an integer, got {stats.get(key)!r}")
        return stats

    @property
    def key(self) -> tuple[str, int]:
        """``(problem_id, repeat)``: the sample."""
        return self.problem_id, self.repeat

    def dump(self) -> dict:
        """The record as its JSON line holds it (fields never set are left out, as v2 did)."""
        return self.model_dump(by_alias=True, exclude_unset=True)

    def line(self) -> str:
        """One JSON line (``json.dumps`` of ``dump``, with its newline)."""
        return json.dumps(self.dump()) + "\n"

    @classmethod
    def new(cls, **fields) -> SampleRecord:
        """A v3 record (``schema``, ``knobs``, ``scope`` set: ``knobs`` from ``method``/``knob``
        and scope "all" unless given).

        Raises:
            pydantic.ValidationError: a field of the wrong type, or an unknown one.
        """
        if "knobs" not in fields and "method" in fields:
            fields["knobs"] = knobs_of(fields["method"], fields.get("knob"))
        fields.setdefault("scope", "all")
        return cls.model_validate(fields | {"schema": RECORDS_SCHEMA})


def load_record(obj: Mapping, where: str = "record") -> SampleRecord:
    """A records-file line's object as a ``SampleRecord``, from schema v2 or v3. A v2 record
    (no ``schema``) keeps every field it had and is read with ``knobs`` from its method and
    ``knob`` and scope ``"all"``; neither is set on it, so ``dump`` gives its v2 object back.

    Raises:
        RecordError: not a record of either schema (``where`` names it).
    """
    try:
        schema = obj.get("schema", 2)
        if schema == 2:
            record = SampleRecord.model_validate(dict(obj))
            knobs = knobs_of(record.method, record.knob) if record.method else {}
            # set without marking them set: dump() gives the v2 object back byte for byte
            object.__setattr__(record, "__dict__", record.__dict__ | {"knobs": knobs, "schema_": 2})
            return record
        if schema != RECORDS_SCHEMA:
            raise RecordError(f"{where}: schema {schema!r} is not one this code reads (2 or {RECORDS_SCHEMA})")
        return SampleRecord.model_validate(dict(obj))
    except ValidationError as err:
        raise RecordError(f"{where}: not a sample record: {err}") from None


_ORDER_BEFORE_SPEEDUP = "speedup"  # the paper's c_rel speed-ups come right before it, as v2 wrote them


class PointMetrics(_Record):
    """One evaluated point against strict at the same N (``relaxtune.tune.judge.point_metrics``):
    the ``metrics`` user attribute of its trial. Units: accuracies and drops are shares of
    paired samples; lengths in tokens; ``l_accept`` drafts per round; speed-ups dimensionless.

    Attributes:
        schema: 3. knobs, scope: the point (see the module). batch_size: the serving batch
            size its speed-up is modeled at.
        n, failed: paired samples, failed generations. accuracy, strict_accuracy,
            accuracy_ci_low/high: accuracies and the relaxed one's Wilson interval.
        drop, drop_lcb, drop_ucb, confidence, bound_method, problems, strict_only,
            relaxed_only, discordance: the paired drop and its bound (``relaxtune.certify``).
        l_accept, length, strict_length, length_ratio, truncated, loop_rate, tokens,
            tokens_per_second: acceptance, lengths, shares, counts, throughput.
        speedup_c<c> (one per paper c_rel, kept as extra fields), speedup, speedup_ucb, c_rel:
            modeled speed-ups and the cost ratio they were priced at.
        per_problem: with repeats, each problem's ``[n, strict_only, relaxed_only, first]``.

    A pruned trial's metrics may be a stage's (the same fields); v2 attributes have no
    schema, knobs, scope or batch size (``load_metrics`` supplies them).
    """

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    schema_: int = Field(RECORDS_SCHEMA, alias="schema")
    knobs: dict[str, float] = {}
    scope: Scope = "all"
    batch_size: int = Field(1, ge=1)
    n: int
    failed: int = 0
    accuracy: float
    strict_accuracy: float
    accuracy_ci_low: float | None = None
    accuracy_ci_high: float | None = None
    drop: float
    drop_lcb: float
    drop_ucb: float
    confidence: float
    bound_method: str
    problems: int
    strict_only: int | float
    relaxed_only: int | float
    discordance: float
    l_accept: float
    length: float
    strict_length: float
    length_ratio: float
    truncated: float
    loop_rate: float
    tokens: int
    tokens_per_second: float
    speedup: float
    speedup_ucb: float
    c_rel: float
    per_problem: list[list[int | float]] | None = None

    @field_validator("knobs")
    @classmethod
    def _finite(cls, knobs: dict[str, float]) -> dict[str, float]:
        if not all(math.isfinite(v) for v in knobs.values()):
            raise ValueError(f"knobs must be finite, got {knobs}")
        return knobs

    def model_post_init(self, _context) -> None:
        for key, value in (self.model_extra or {}).items():
            if not (key.startswith("speedup_c") and isinstance(value, (int, float))):
                raise ValueError(f"unknown point metric {key!r}")

    @property
    def speedup_by_c_rel(self) -> dict[str, float]:
        """The paper's c_rel values (as ``f"{c:g}"``) -> modeled speed-up."""
        return {k.removeprefix("speedup_c"): v for k, v in (self.model_extra or {}).items()}

    @model_serializer(mode="wrap")
    def _in_v2_order(self, handler):
        """v2's key order: the new v3 keys first, then judge's order, with the
        ``speedup_c<c>`` extras right before ``speedup``."""
        out = handler(self)
        extra = {k: out.pop(k) for k in list(out) if k.startswith("speedup_c")}
        ordered: dict = {}
        for key, value in out.items():
            if key == _ORDER_BEFORE_SPEEDUP:
                ordered |= extra
            ordered[key] = value
        return ordered

    def dump(self) -> dict:
        """JSON-ready, in the stored order (fields never set are left out, as v2 did)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


def _loaded(model: BaseModel, defaults: dict) -> BaseModel:
    """``model`` with ``defaults`` filled in as values that were not set (``dump`` leaves them out)."""
    object.__setattr__(model, "__dict__", model.__dict__ | defaults)
    return model


def load_metrics(obj: Mapping, knobs: Mapping[str, float] | None = None, where: str = "metrics") -> PointMetrics:
    """A trial's ``metrics`` attribute as ``PointMetrics``, from schema v2 or v3. A v2 one
    (no ``schema``) takes ``knobs`` (from its trial's parameters: ``trial_metrics``), scope
    ``"all"`` and batch size 1, unset, so ``dump`` gives its v2 object back.

    Raises:
        RecordError: not a point's metrics of either schema.
    """
    try:
        schema = obj.get("schema", 2)
        if schema == 2:
            return _loaded(PointMetrics.model_validate(dict(obj)), {"knobs": dict(knobs or {}), "schema_": 2})
        if schema != RECORDS_SCHEMA:
            raise RecordError(f"{where}: schema {schema!r} is not one this code reads (2 or {RECORDS_SCHEMA})")
        return PointMetrics.model_validate(dict(obj))
    except ValidationError as err:
        raise RecordError(f"{where}: not a point's metrics: {err}") from None


def _method_of(trial) -> str | None:
    """The method of a trial's study, from its name (``<task>__<method>__...``), if any."""
    name = getattr(getattr(trial, "study", None), "study_name", None)
    return name.split("__")[1] if name and name.count("__") >= 2 else None


def trial_metrics(trial, method: str | None = None) -> PointMetrics | None:
    """A finished Optuna trial's metrics (``FrozenTrial`` or ``Trial``), typed, or None when it
    has none (failed, or not run yet); a v2 trial's knobs come from its ``knob`` parameter and
    ``method`` (the registry's knob name).

    Raises:
        RecordError: its metrics do not validate.
    """
    raw = trial.user_attrs.get("metrics")
    if not raw:
        return None
    knob = trial.params.get("knob")
    knobs = knobs_of(method, knob) if method else ({} if knob is None else {"knob": float(knob)})
    return load_metrics(raw, knobs, where=f"trial {trial.number}")


def metrics_attr(metrics: Mapping, method: str, knob: float | None, scope: str = "all", batch_size: int = 1) -> dict:
    """The v3 ``metrics`` user attribute of a point (validated; raises ``RecordError``):
    ``metrics`` (``point_metrics``'s dict) with ``schema``, ``knobs``, ``scope`` and
    ``batch_size`` first, its own values as they are (an integer count stays one)."""
    out = {"schema": RECORDS_SCHEMA, "knobs": knobs_of(method, knob), "scope": scope, "batch_size": batch_size}
    out |= {k: v for k, v in metrics.items() if k not in out}
    try:
        PointMetrics.model_validate(out)
    except ValidationError as err:
        raise RecordError(f"{method} at knob {knob}: not a point's metrics: {err}") from None
    return out


V3_HEADER = ("schema", "knobs", "scope", "batch_size")  # what v3 adds first to a trial's metrics


def point_values(stored: Mapping | None) -> dict:
    """A trial's stored ``metrics`` attribute (v2 or v3, or none) as ``point_metrics``
    made it: without v3's header, so a tracker logs the same MLflow metrics from either."""
    return {k: v for k, v in (stored or {}).items() if k not in V3_HEADER}
