"""The tuned config's schema (YAML, ``schema_version`` ``SCHEMA_VERSION``): the file
(``TunedConfig``), each method's outcome (``MethodResult``), the recommendation
(``Recommendation``), the best point per serving batch size (``ByBatchSize``,
``BatchBest``) and the ``transfer`` section (``Transfer``, ``TransferCell``); and how
an older file reads as today's (``upgrade_config``). ``relaxtune.report.export``
builds, saves and loads it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from ..tune.recommend import PLAIN, as_plain
from ..tune.records import RECORDS_SCHEMA, knobs_of

__all__ = [
    "SCHEMA_VERSION",
    "MethodResult",
    "Recommendation",
    "FastestSpeculative",
    "PLAIN",
    "BatchBest",
    "ByBatchSize",
    "TransferCell",
    "Transfer",
    "TunedConfig",
    "upgrade_config",
]

SCHEMA_VERSION = RECORDS_SCHEMA  # 3: knobs (named), scope, serving batch sizes (relaxtune.tune.records);
# 2: drop_upper_bound from the confirmation run; confirmation, sample, margins


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MethodResult(_Model):
    """One method's outcome. ``knob``/``n_draft`` (and ``trial``, the confirmed
    trial's number in its study) are None when no point was confirmed; the
    point's numbers come from its confirmation run, the search's bound for it is
    ``search_drop_upper_bound`` (at the job's confidence), and ``confirmation``
    lists every attempt (``relaxtune.tune.confirm.Attempt.summary``)."""

    method: str
    knob_name: str | None
    feasible: bool
    knob: float | None = None
    knobs: dict[str, float] | None = None  # v3: every named knob of the point (None: no point)
    scope: str | None = None  # v3: the relaxation scope ("all" | "thinking")
    n_draft: int | None = None
    trial: int | None = None
    strict_accuracy: float | None = None
    accuracy: float | None = None
    accuracy_ci: tuple[float, float] | None = None
    n: int | None = None
    drop: float | None = None
    drop_upper_bound: float | None = None  # the confirmation's, at confirmation.confidence
    drop_bound_method: str | None = None
    search_drop_upper_bound: float | None = None
    l_accept: float | None = None
    length_ratio: float | None = None
    modeled_speedup: float | None = None
    modeled_speedup_by_c_rel: dict[str, float] = {}
    truncated: float | None = None
    loop_rate: float | None = None
    trials: int = 0  # completed or pruned
    pruned: int = 0
    failed: int = 0
    tokens_spent: int = 0
    study_name: str
    mlflow_run_id: str | None = None
    serving: dict | None = None
    closest: dict | None = None  # when infeasible: the tried point with the smallest drop bound
    confirmation: dict | None = None  # {confidence, attempts: [...], missing}
    note: str | None = None  # why no point is exported
    deploy: dict | str | None = None  # engine -> block in its own syntax, or one line (relaxtune.report.deploy)


class FastestSpeculative(_Model):
    """The fastest speculative point of a job whose recommendation is plain decoding, for
    information only (it models a speed-up below 1 on the measured costs): strict at its
    fastest N, or a confirmed relaxed point, with the reason it was the fastest."""

    method: str
    knob: float | None = None
    knobs: dict[str, float] = {}
    scope: str = "all"
    n_draft: int
    modeled_speedup: float  # below 1: slower than plain decoding
    speed_margin: dict | None = None
    reason: str


class Recommendation(_Model):
    """What to deploy for this task: a speculative point (``method`` strict or a relaxed
    method, its knobs and draft length N), or ``method`` ``plain`` (``PLAIN``): plain
    decoding of the verifier, no N and no knobs, modeled at 1x over AR by definition,
    with the fastest speculative point beside it (``fastest_speculative``), when no
    speculative point pays on the measured costs (``relaxtune.tune.recommend``).
    ``decoding`` says the same in one word ("plain" exactly when ``method`` is plain)."""

    method: str
    knob: float | None
    knobs: dict[str, float] = {}  # v3: every named knob ({} for strict and plain)
    scope: str = "all"  # v3
    n_draft: int | None  # None for plain decoding
    batch_size: int = 1  # v3: the serving batch size the speed-up is modeled at (with weights: the heaviest)
    # the weighting of serving batch sizes (batch size -> weight) when modeled_speedup is their weighted mean of
    # speed-ups, not batch_size's alone; None: modeled at batch_size alone
    weights: dict[str, float] | None = None
    modeled_speedup: float  # 1.0 for plain decoding
    reason: str
    serving: dict
    strict_modeled_speedup: float | None = None  # strict's best, over every evaluated N
    speed_margin: dict | None = None  # {difference, margin, confidence, how}: relaxed only when difference > margin
    decoding: str = "speculative"  # "plain": no speculative point pays; serve the verifier alone
    fastest_speculative: FastestSpeculative | None = None  # plain decoding only: the point it beats
    deploy: dict | str | None = None  # engine -> block (relaxtune.report.deploy)

    @model_validator(mode="after")
    def _plain_is_plain(self) -> Recommendation:
        """Plain decoding carries no speculative point of its own, and says so in ``decoding``."""
        plain = self.method == PLAIN
        if plain != (self.decoding == PLAIN):
            raise ValueError(f"recommendation: method {self.method!r} with decoding {self.decoding!r}")
        if plain and (self.n_draft is not None or self.knob is not None or self.knobs):
            raise ValueError("recommendation: plain decoding has no draft length and no knobs")
        if not plain and (self.n_draft is None or self.fastest_speculative is not None):
            raise ValueError(f"recommendation: {self.method} needs a draft length and no fastest_speculative")
        return self


class BatchBest(_Model):
    """The best confirmed point at one serving batch size (``relaxtune.tune.batches.by_batch``):
    strict at its fastest N there, or a method's confirmed point, priced with that batch
    size's costs against batched AR at the same batch size. ``decoding`` is ``plain`` where
    even the best is below 1 (serve the verifier alone at that batch size)."""

    method: str
    knob: float | None = None
    knobs: dict[str, float] = {}
    n_draft: int
    modeled_speedup: float  # over batched AR at this batch size
    decoding: str = "speculative"


class ByBatchSize(_Model):
    """The speed a deployment sees at each profiled serving batch size, for information
    beside the one deployable ``recommendation`` (engines set N and the rule server-wide):
    ``best`` per batch size, every candidate's modeled speed-up per batch size
    (``speedups``: ``strict N=<n>`` or a method -> batch size -> speed-up), the batch size
    from which speculative decoding stops paying (``relaxtune.decoding.serving.stops_paying_at``
    of the best per batch size; None: it pays up to the largest) and that, in one ``line``."""

    best: dict[int, BatchBest]
    speedups: dict[str, dict[int, float]]
    stops_paying_at: int | None = None
    line: str


class TransferCell(_Model):
    """A tuned point of one task judged on another (``relaxtune.transfer``): a
    source task's confirmed point of a method against the target's strict at the
    same N, paired on the same problems and seeds, bounded at the transfer's
    ``confidence_each``. ``samples`` is "confirmation" on the diagonal (the
    target's own point on the samples of its passed confirmation) and "search"
    elsewhere (the target's search problems and seed); ``error`` says why a
    cell has no numbers (its evaluation failed: not within epsilon)."""

    knob: float | None
    n_draft: int
    within_epsilon: bool
    epsilon: float  # the target's
    drop_upper_bound: float | None = None
    drop: float | None = None
    n: int | None = None
    problems: int
    seed: int
    samples: str
    accuracy: float | None = None
    strict_accuracy: float | None = None
    modeled_speedup: float | None = None  # on the target, at the target's costs
    error: str | None = None


class Transfer(_Model):
    """The ``transfer`` section of a tuned config, written by ``relaxtune transfer``.

    ``sources``: source task -> method -> that task's tuned point judged on this
    task (this task's own point is the diagonal, on its confirmation samples);
    ``targets``: target task -> method -> this task's tuned point judged on
    that task, against its epsilon (empty: never checked beyond its own task).
    Every cell is judged at ``confidence_each``, the transfer's ``confidence``
    split over its ``cells`` (``rule``)."""

    tasks: list[str]
    confidence: float
    confidence_each: float
    cells: int
    rule: str
    sources: dict[str, dict[str, TransferCell]] = {}
    targets: dict[str, dict[str, TransferCell]] = {}
    created: str
    mlflow: dict | None = None


class TunedConfig(_Model):
    """The exported file (``transfer``: written later by ``relaxtune transfer``)."""

    schema_version: int = SCHEMA_VERSION
    task: str
    task_version: int
    grader: dict
    drafter: str
    verifier: str
    dtype: str | None  # what the models ran at (transformers, SGLang); None on llama.cpp (``weights`` has the format)
    runtime: str | None = None  # what ran the models (hf, llamacpp, sglang)
    weights: dict | None = None  # drafter/verifier: the exact weights measured (relaxtune.report.deploy.weights)
    sampling: dict
    seed: int
    problems: int
    repeats: int
    epsilon: float
    confidence: float
    c_rel: float
    cost_profile: dict | None = None
    serving_batch_sizes: list[int] = [1]  # v3: the batch sizes the speed-ups are modeled at
    by_batch_size: ByBatchSize | None = None  # v3: the best confirmed point per serving batch size
    strict_by_n_draft: dict[int, dict]
    methods: dict[str, MethodResult]
    confirmation: dict  # {samples: holdout | seeds, problems, per_method, planned, confidence_each, rule, promise}
    sample: dict  # relaxtune.certify.planning.SamplePlan: smallest certifiable drop, problems needed; line
    recommendation: Recommendation
    relaxtune_version: str
    created: str
    mlflow: dict | None = None
    transfer: Transfer | None = None

    @field_validator("c_rel")
    @classmethod
    def _c_rel_precision(cls, c_rel: float) -> float:
        """c_rel at 4 significant digits (a timing's noise is far above that); the raw
        timings stay in ``cost_profile``."""
        return float(f"{c_rel:.4g}")


def upgrade_config(data: dict) -> dict:
    """A tuned config's YAML object, v2 (or v3) as v3: each exported point's and the
    recommendation's ``knobs`` from its one ``knob`` (``relaxtune.tune.records.knobs_of``),
    scope "all" and batch size 1 (what every v2 job measured); and, for either, a plain
    recommendation written as the fastest speculative point with ``decoding: plain`` as
    ``method: plain`` (``_plain_recommendation``), a llama.cpp run's unused ``dtype`` dropped.

    Raises:
        ValueError: a schema version this code does not read.
    """
    version = data.get("schema_version")
    if version == SCHEMA_VERSION:
        return _plain_recommendation(_dtype_where_it_applies(data))
    if version != 2:
        raise ValueError(f"tuned config schema_version {version!r} is not one this code reads (2 or {SCHEMA_VERSION})")
    out = dict(data) | {"schema_version": SCHEMA_VERSION}
    out.setdefault("serving_batch_sizes", [1])
    methods = {}
    for name, m in (data.get("methods") or {}).items():
        m = dict(m)
        if m.get("n_draft") is not None:
            m.setdefault("knobs", knobs_of(m.get("method", name), m.get("knob")))
            m.setdefault("scope", "all")
        methods[name] = m
    out["methods"] = methods
    if isinstance(rec := data.get("recommendation"), dict):
        out["recommendation"] = {
            "knobs": knobs_of(rec["method"], rec.get("knob")),
            "scope": "all",
            "batch_size": 1,
        } | rec
    return _plain_recommendation(_dtype_where_it_applies(out))


def _dtype_where_it_applies(data: dict) -> dict:
    """A llama.cpp run's config without a ``dtype`` (the GGUF runs as quantised; its format is in
    ``weights``): files written before this rule carried the job's unused ``--dtype``."""
    if data.get("runtime") == "llamacpp" and data.get("dtype") is not None:
        return data | {"dtype": None}
    return data


def _plain_recommendation(data: dict) -> dict:
    """A recommendation written before ``method: plain`` existed (``decoding: plain`` beside the
    fastest speculative point's method, knob and N) as today's: ``method`` plain, no N and no
    knobs, speed-up 1, the point moved to ``fastest_speculative``."""
    rec = data.get("recommendation")
    if not isinstance(rec, dict) or rec.get("decoding") != PLAIN or rec.get("method") == PLAIN:
        return data
    point = {k: rec.get(k) for k in ("method", "knob", "n_draft", "modeled_speedup", "speed_margin")}
    point |= {"knobs": rec.get("knobs") or {}, "scope": rec.get("scope", "all")}
    reason, _, earlier = rec["reason"].partition("; for reference, ")
    point["reason"] = earlier or reason
    return data | {"recommendation": as_plain(rec, reason, point)}
