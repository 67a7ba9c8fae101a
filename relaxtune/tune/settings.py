"""The settings of a tuning job, declared once: nested models (model pair and runtime, statistics,
search, stores, workers) read and written under today's flat names (CLI flags, ``--config`` YAML
keys, Prefect flow parameters, the saved ``<task>.job.yaml``, MLflow params); study names and job ids.

Each field holds its one default and its one description: ``relaxtune.cli.options`` makes every
command-line option from them, ``flows/`` every flow parameter. Nothing here touches the disk or
the machine: ``start`` (called where a job starts) makes the output folder and resolves the
``auto`` runtime and serving batch sizes, which the job then records.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from ..backends.embedded import DRAFTER, VERIFIER
from ..decoding.methods import get_method
from .store_uris import check_storage_uri, check_tracking_uri

__all__ = [
    "PairSettings",
    "StatsSettings",
    "SearchSettings",
    "StoreSettings",
    "WorkerSettings",
    "TuneSettings",
    "GROUPS",
    "DTYPES",
    "field_info",
    "flat_fields",
    "storage_url",
    "start",
    "auto_batch_sizes",
    "study_name",
    "job_id",
    "spec_digest",
]

DTYPES = ("bfloat16", "float16", "float32")
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)  # no NaN or infinity in any number field


class PairSettings(BaseModel):
    """The model pair and where it runs (``relaxtune.backends.load.load_backend``'s arguments)."""

    model_config = _STRICT

    drafter: str = Field(
        DRAFTER.name, description="drafter: embedded name, folder, hub id, or prompt-lookup[:n] (no model)"
    )
    verifier: str = Field(VERIFIER.name, description="verifier: embedded name, folder or hub id")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        description="weights' dtype of the transformers runtime (bfloat16 is the fastest on a CPU); "
        "llama.cpp runs the GGUF files' own",
    )
    runtime: Literal["auto", "hf", "llamacpp"] = Field(
        "auto",
        description="in-process backend: hf (transformers) or llamacpp (llama.cpp on the GGUF files; pip "
        "install 'relaxtune[llamacpp]'); auto: llamacpp for the embedded pair when installed, else hf (resolved "
        "when the job starts, and recorded)",
    )
    drafter_url: str | None = Field(
        None, description="SGLang drafter server URL (with --verifier-url: run against SGLang)"
    )
    verifier_url: str | None = Field(None, description="SGLang verifier server URL")
    tokenizer: str | None = Field(
        None, description="tokenizer id/folder for SGLang or llama.cpp (default: the verifier's)"
    )
    native_url: str | None = Field(
        None,
        description="STANDALONE speculative SGLang server for sglang_threshold (`relaxtune serve --native-threshold`)",
    )
    concurrency: int = Field(8, ge=1, description="sequences in flight against SGLang servers")
    batch_size: int | None = Field(
        None,
        ge=1,
        description="sequences the in-process engine decodes together "
        "(default: 8 on a CPU, 32 on a GPU; 1: one at a time)",
    )

    @field_validator("drafter")
    @classmethod
    def _lookup_form(cls, drafter: str) -> str:
        from ..backends.lookup import parse_lookup

        parse_lookup(drafter)  # a malformed prompt-lookup:<n> is refused whatever the runtime
        return drafter

    @model_validator(mode="after")
    def _runtime_or_servers(self):
        if self.runtime == "llamacpp" and (self.drafter_url or self.verifier_url):
            raise ValueError(
                "--runtime llamacpp runs the models in-process, and --drafter-url/--verifier-url run "
                "them on SGLang servers: give one or the other"
            )
        return self

    @field_validator("drafter_url", "verifier_url", "native_url")
    @classmethod
    def _server_url(cls, url: str | None) -> str | None:
        from urllib.parse import urlsplit

        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or url != url.strip():
            raise ValueError(f"{url!r} is not a server URL; give e.g. http://127.0.0.1:30000")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"{url!r}: the port is not a number in 0-65535") from None
        return url

    @property
    def backend(self) -> dict:
        """The keyword arguments of ``relaxtune.backends.load.load_backend`` (and of
        ``backend_name``, less the loading ones). The runtime is resolved (``resolved_runtime``)."""
        return self.model_dump() | {"runtime": self.resolved_runtime()}

    def resolved_runtime(self) -> str:
        """``runtime``, with ``auto`` resolved on this machine (``relaxtune.backends.load.resolve_runtime``)."""
        from ..backends.load import resolve_runtime

        return resolve_runtime(self.runtime, self.drafter, self.verifier, self.drafter_url, self.verifier_url)


class StatsSettings(BaseModel):
    """What the job certifies and how: the budget, the confidence, the guards and the confirmation."""

    model_config = _STRICT

    epsilon: float = Field(0.05, ge=0.0, le=1.0, description="allowed accuracy drop vs strict")
    confidence: float = Field(0.9, gt=0.5, lt=1.0, description="one-sided confidence of the drop bound")
    c_rel: float | Literal["measured"] = Field(
        "measured",
        description="drafter/verifier cost ratio, or 'measured': a fixed value overrides the measured profile",
    )
    remeasure_costs: bool = Field(
        False, description="measure the cost profile anew, replacing the one saved in --output-dir"
    )
    serving_batch_sizes: list[int] | Literal["auto"] = Field(
        "auto",
        description="comma-separated serving batch sizes the cost profile is measured at, or auto: 1,4,16 on a "
        "CPU or llama.cpp, 1,8,32,128 on a GPU (resolved when the job starts, and recorded); the declared size "
        "and the weighted ones are added",
    )
    serving_batch_size: int | None = Field(
        None,
        ge=1,
        description="the serving batch size the search prices at and the export deploys at (default 1; "
        "exclusive with --serving-batch-weights)",
    )
    serving_batch_weights: dict[int, float] | None = Field(
        None,
        description="weights of serving batch sizes in the search's speed objective, e.g. 1=0.2,16=0.8 "
        "(the weighted mean of their speed-ups; exclusive with --serving-batch-size)",
    )
    max_length_ratio: float | None = Field(None, gt=0, description="optional guard on L_relax / L_strict")
    max_truncated: float | None = Field(None, ge=0, le=1, description="optional guard on the truncated share")
    confirm: Literal["holdout", "seeds"] = Field(
        "holdout",
        description="confirmation samples: 'holdout', a held-out half of the problems that the search "
        "never sees, split before any generation (a promise about problems like these); or 'seeds', fresh seeds on "
        "the search's problems (a promise about these problems only)",
    )
    confirmations: int = Field(
        2,
        ge=1,
        description="points confirmed at most per method; the confidence is split "
        "evenly over every confirmation the search allows",
    )

    @field_validator("c_rel")
    @classmethod
    def _finite_c_rel(cls, c_rel):
        if c_rel != "measured" and not (math.isfinite(c_rel) and c_rel >= 0):
            raise ValueError(f"c_rel must be a finite number >= 0 or 'measured', got {c_rel}")
        return c_rel

    @field_validator("serving_batch_sizes", mode="before")
    @classmethod
    def _batch_sizes_text(cls, sizes):
        """A flag's text: ``auto``, or comma-separated integers."""
        if not isinstance(sizes, str) or sizes.strip() == "auto":
            return sizes.strip() if isinstance(sizes, str) else sizes
        items = [v.strip() for v in sizes.split(",") if v.strip()]
        bad = [v for v in items if not v.lstrip("-").isdigit()]
        if bad or not items:
            raise ValueError(f"{(bad or [sizes])[0]!r} is not an integer: give auto or e.g. 1,4,16")
        return [int(v) for v in items]

    @field_validator("serving_batch_sizes")
    @classmethod
    def _positive_batch_sizes(cls, sizes):
        if sizes != "auto" and (not sizes or any(b < 1 for b in sizes)):
            raise ValueError(f"serving_batch_sizes must be integers >= 1, got {sizes}")
        return sizes if sizes == "auto" else sorted(set(sizes))

    @field_validator("serving_batch_weights", mode="before")
    @classmethod
    def _weights_text(cls, weights):
        """A flag's text: comma-separated ``<batch size>=<weight>`` pairs."""
        if not isinstance(weights, str):
            return weights
        out = {}
        for item in (v.strip() for v in weights.split(",") if v.strip()):
            size, eq, weight = (t.strip() for t in item.partition("="))
            try:
                if not eq or not size.isdigit() or int(size) in out:
                    raise ValueError
                out[int(size)] = float(weight)
            except ValueError:
                raise ValueError(
                    f"{item!r} is not <batch size>=<weight> (each size once): give e.g. 1=0.2,16=0.8"
                ) from None
            if not (math.isfinite(out[int(size)]) and out[int(size)] > 0):
                raise ValueError(f"{item!r}: a weight must be a finite number > 0")
        if not out:
            raise ValueError(f"{weights!r} holds no <batch size>=<weight>: give e.g. 1=0.2,16=0.8")
        return out

    @field_validator("serving_batch_weights")
    @classmethod
    def _positive_weights(cls, weights):
        if weights is None:
            return None
        if not weights:
            raise ValueError("give one <batch size>=<weight> at least, e.g. 1=0.2,16=0.8")
        for size, weight in weights.items():
            if size < 1:
                raise ValueError(f"batch size {size}: batch sizes are integers >= 1")
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"batch size {size}: a weight must be a finite number > 0, got {weight}")
        return dict(sorted(weights.items()))

    @model_validator(mode="after")
    def _declared_among_sizes(self):
        if self.serving_batch_size is not None and self.serving_batch_weights is not None:
            raise ValueError(
                f"--serving-batch-size {self.serving_batch_size} and --serving-batch-weights both say what the "
                "search prices at: give one or the other"
            )
        if self.serving_batch_sizes != "auto":  # the declared and weighted sizes are measured too
            self.serving_batch_sizes = sorted(set(self.serving_batch_sizes) | set(self.serving_weights))
        return self

    @property
    def serving_weights(self) -> dict[int, float]:
        """Batch size -> weight of its speed-up in the search's objective:
        ``serving_batch_weights``, else ``{serving_batch_size or 1: 1}``."""
        return dict(self.serving_batch_weights or {self.serving_batch_size or 1: 1.0})


class SearchSettings(BaseModel):
    """What the search tries: the methods, draft lengths, trials, problems and seeds."""

    model_config = _STRICT

    methods: list[str] = Field(
        ["cactus", "mentored"], description="comma-separated method ids (see `relaxtune methods`)"
    )
    n_drafts: list[int] = Field([3, 5, 10, 20], description="comma-separated draft lengths")
    trials: int = Field(8, ge=1, description="completed or pruned trials per method")
    limit: int | None = Field(None, ge=1, description="first N problems only")
    seed: int = Field(0, description="base seed")
    stage_size: int = Field(4, ge=1, description="problems per evaluation stage (pruning granularity)")
    deployable_on: list[str] | None = Field(
        None,
        exclude=True,  # applied where the job starts (the kept methods are what the job records)
        description="comma-separated serving engines (vllm, sglang, trtllm, transformers): keep the methods one of "
        "them runs at the task's sampling, refuse the rest by name",
    )

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: list[str]) -> list[str]:
        for m in methods:
            get_method(m)
        if "strict" in methods:
            raise ValueError("strict is the baseline every study compares against; tune relaxed methods")
        if not methods:
            raise ValueError("give at least one method")
        return methods

    @field_validator("deployable_on")
    @classmethod
    def _known_engines(cls, engines: list[str] | None) -> list[str] | None:
        from ..decoding.deployable import ENGINES

        if engines is not None and (not engines or any(e not in ENGINES for e in engines)):
            raise ValueError(f"engines are {', '.join(ENGINES)}; got {', '.join(engines) or 'none'}")
        return engines

    @field_validator("n_drafts")
    @classmethod
    def _positive_drafts(cls, n_drafts: list[int]) -> list[int]:
        if not n_drafts or any(n < 1 for n in n_drafts):
            raise ValueError(f"n_drafts must be integers >= 1, got {n_drafts}")
        return sorted(set(n_drafts))

    @property
    def mid_n_draft(self) -> int:
        """The middle draft length of ``n_drafts`` (the paper's grid runs there first)."""
        return self.n_drafts[(len(self.n_drafts) - 1) // 2]


class StoreSettings(BaseModel):
    """Where the job keeps what it makes: records, studies, MLflow runs, the tuned config."""

    model_config = _STRICT

    output_dir: str = Field("relaxtune-runs", description="records, Optuna db and tuned config")
    storage: str | None = Field(None, description="Optuna storage URL (default: sqlite:///<output-dir>/optuna.db)")
    mlflow_uri: str | None = Field(None, description="MLflow tracking URI (default: sqlite:///mlflow.db)")
    export: str | None = Field(None, description="tuned config path (default: <output-dir>/<task>.tuned.yaml)")
    job_id: str | None = Field(
        None,
        description="the tuning job's id in MLflow, shared by every worker of one job "
        "(default: a digest of the storage, the task and the settings that shape trials)",
    )

    @field_validator("storage")
    @classmethod
    def _storage_form(cls, storage: str | None) -> str | None:
        return None if storage is None else check_storage_uri(storage)

    @field_validator("mlflow_uri")
    @classmethod
    def _tracking_form(cls, uri: str | None) -> str | None:
        return None if uri is None else check_tracking_uri(uri)

    @field_validator("output_dir", "export")
    @classmethod
    def _path_text(cls, path: str | None) -> str | None:
        if path is not None and (not path.strip() or "\0" in path):
            raise ValueError(f"{path!r} is not a path")
        return path

    @field_validator("job_id")
    @classmethod
    def _job_id_text(cls, job_id: str | None) -> str | None:
        if job_id is not None and (not job_id.strip() or job_id != job_id.strip()):
            raise ValueError(f"{job_id!r}: give an id without spaces around it, or none (the default digest)")
        return job_id


class WorkerSettings(BaseModel):
    """How this worker runs its share of the job."""

    model_config = _STRICT

    parallel_trials: int = Field(
        1,
        ge=1,
        description="trials this worker runs at once (threads, or Prefect task "
        "runs); start the same command on other hosts with the same --storage to add workers",
    )
    heartbeat: int = Field(30, ge=1, description="seconds between heartbeats of a running trial")
    grace_period: int | None = Field(
        None,
        ge=1,
        description="seconds without a heartbeat before a running trial "
        "counts as stale and is retried once (default: 4 x heartbeat)",
    )
    range_size: int | None = Field(
        None,
        ge=1,
        description="problems per evaluation range: ranges run as separate "
        "task runs (Prefect) or are shared among workers, then merge (default: all)",
    )

    @model_validator(mode="after")
    def _grace_after_heartbeat(self):
        if self.grace_period is not None and self.grace_period <= self.heartbeat:
            raise ValueError(
                f"grace_period ({self.grace_period} s) must exceed heartbeat ({self.heartbeat} s), or a "
                "live trial between two heartbeats would count as stale"
            )
        return self

    @property
    def stale_after(self) -> int:
        """Seconds without a heartbeat after which a running trial is stale (``grace_period`` or 4 x ``heartbeat``)."""
        return self.grace_period or 4 * self.heartbeat


# group attribute -> its model; the flat names are the groups' field names (each belongs to one group)
GROUPS: dict[str, type[BaseModel]] = {
    "pair": PairSettings,
    "stats": StatsSettings,
    "search": SearchSettings,
    "stores": StoreSettings,
    "workers": WorkerSettings,
}
# the order a flat dump writes its keys in (the saved job YAML's, as before the groups); a field not named
# here comes after these, in group order
_FLAT_ORDER = (
    "task",
    "methods",
    "drafter",
    "verifier",
    "dtype",
    "runtime",
    "drafter_url",
    "verifier_url",
    "tokenizer",
    "native_url",
    "concurrency",
    "batch_size",
    "epsilon",
    "confidence",
    "c_rel",
    "remeasure_costs",
    "serving_batch_sizes",
    "serving_batch_size",
    "serving_batch_weights",
    "n_drafts",
    "trials",
    "limit",
    "seed",
    "stage_size",
    "output_dir",
    "storage",
    "mlflow_uri",
    "max_length_ratio",
    "max_truncated",
    "export",
    "parallel_trials",
    "heartbeat",
    "grace_period",
    "range_size",
    "job_id",
    "confirm",
    "confirmations",
)


class TuneSettings(BaseModel):
    """Everything a tuning job needs, grouped (``pair``, ``stats``, ``search``, ``stores``,
    ``workers``). Built from flat keys (``TuneSettings(task=..., epsilon=0.1)``, a ``--config``
    YAML, a saved job) or from the groups; dumped flat (``model_dump``), so a YAML written
    before the groups still loads and MLflow params keep their names. Each field is also
    reachable flat (``settings.epsilon`` is ``settings.stats.epsilon``), a view generated from the groups.

    Raises:
        pydantic.ValidationError: an unknown key, or a field's value refused (located
            ``(group, field)``, or ``(key,)`` for an unknown key).
    """

    model_config = ConfigDict(extra="forbid", frozen=False)

    task: str = Field(description="task name (see `relaxtune tasks`) or YAML path")
    pair: PairSettings = PairSettings()
    stats: StatsSettings = StatsSettings()
    search: SearchSettings = SearchSettings()
    stores: StoreSettings = StoreSettings()
    workers: WorkerSettings = WorkerSettings()

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        """Flat keys go into their group (a group given whole is kept; both at once: the flat keys win)."""
        if not isinstance(data, dict):
            return data
        out = {k: v for k, v in data.items() if k not in _OWNER}
        for key, value in data.items():
            if key in _OWNER:
                group = _OWNER[key]
                given = out.get(group)
                given = given.model_dump() if isinstance(given, BaseModel) else dict(given or {})
                out[group] = given | {key: value}
        return out

    @model_validator(mode="after")
    def _llamacpp_slots(self):
        if self.pair.runtime == "llamacpp":  # auto resolves to it where the job starts (``start`` checks there)
            check_slots(self.pair, self.stats.serving_batch_sizes)
        return self

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict:
        nested = handler(self)
        flat = {k: v for k, v in nested.items() if k not in GROUPS}
        for group in GROUPS:
            flat.update(nested.get(group) or {})
        order = {k: i for i, k in enumerate(_FLAT_ORDER)}
        return dict(sorted(flat.items(), key=lambda kv: order.get(kv[0], len(order))))

    def model_copy(self, *, update: dict | None = None, deep: bool = False) -> TuneSettings:
        """A copy with ``update`` (flat keys, or groups) applied and validated again."""
        if not update:
            return super().model_copy(deep=deep)
        return type(self)(**(self.model_dump() | update))

    @property
    def storage_url(self) -> str:
        """The Optuna storage URL (``storage_url``; no side effect)."""
        return storage_url(self.stores)

    @property
    def backend(self) -> dict:
        """``PairSettings.backend``."""
        return self.pair.backend

    @property
    def mid_n_draft(self) -> int:
        """``SearchSettings.mid_n_draft``."""
        return self.search.mid_n_draft

    @property
    def stale_after(self) -> int:
        """``WorkerSettings.stale_after``."""
        return self.workers.stale_after


_OWNER = {name: group for group, model in GROUPS.items() for name in model.model_fields}


def _view(group: str, name: str) -> property:
    def write(self, value) -> None:
        setattr(getattr(self, group), name, value)

    return property(lambda self: getattr(getattr(self, group), name), write, doc=f"``{group}.{name}``")


for _name, _group in _OWNER.items():  # flat views of the groups' fields, generated from the groups
    setattr(TuneSettings, _name, _view(_group, _name))


def flat_fields() -> dict[str, Any]:
    """Every flat setting name -> its pydantic ``FieldInfo`` (default, description,
    annotation, constraints), in the flat dump's order: what the CLI and the flows are made from."""
    fields = {"task": TuneSettings.model_fields["task"]}
    fields |= {name: GROUPS[group].model_fields[name] for name, group in _OWNER.items()}
    order = {k: i for i, k in enumerate(_FLAT_ORDER)}
    return dict(sorted(fields.items(), key=lambda kv: order.get(kv[0], len(order))))


def field_info(name: str):
    """The ``FieldInfo`` of flat setting ``name``.

    Raises:
        KeyError: not a setting.
    """
    return flat_fields()[name]


def storage_url(stores: StoreSettings) -> str:
    """The Optuna storage URL: ``stores.storage``, else ``sqlite:///<output_dir>/optuna.db``
    (absolute). Touches nothing (``start`` makes the folder)."""
    if stores.storage:
        return stores.storage
    return f"sqlite:///{Path(stores.output_dir).resolve() / 'optuna.db'}"


def make_output_dir(stores: StoreSettings) -> Path:
    """Create ``stores.output_dir`` (and its parents) if missing; the folder.

    Raises:
        ValueError: ``--output-dir`` names a file (or lies under one), or cannot be made.
    """
    path = Path(stores.output_dir)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise ValueError(f"--output-dir {stores.output_dir}: {part} is a file, not a folder; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--output-dir {stores.output_dir}: cannot create it ({err.strerror})") from None
    return path


def start(settings: TuneSettings) -> TuneSettings:
    """Where a job starts: the output folder made (``make_output_dir``), the ``auto``
    runtime and the ``auto`` serving batch sizes (``auto_batch_sizes``, with the declared
    and weighted ones added) resolved on this machine, so records, studies, the saved job
    and MLflow name them.

    Raises:
        ValueError: an output folder that is a file, or a runtime that cannot run here.
    """
    make_output_dir(settings.stores)
    update = {}
    runtime = settings.pair.resolved_runtime()
    if runtime != settings.pair.runtime:
        update["runtime"] = runtime
    if settings.stats.serving_batch_sizes == "auto":
        update["serving_batch_sizes"] = auto_batch_sizes(settings.pair, runtime)
    started = settings.model_copy(update=update) if update else settings
    if runtime == "llamacpp":
        check_slots(started.pair, started.stats.serving_batch_sizes)
    return started


def check_slots(pair: PairSettings, sizes: list[int] | str) -> None:
    """Refuse serving batch sizes above llama.cpp's sequence slots (its contexts'
    ``n_seq_max``: ``--batch-size``, default ``BATCH_SIZE_LLAMACPP``): they cannot be measured.

    Raises:
        ValueError: naming the flags that fix it.
    """
    from ..backends.llamacpp import BATCH_SIZE_LLAMACPP

    slots = pair.batch_size or BATCH_SIZE_LLAMACPP
    if sizes != "auto" and max(sizes) > slots:
        raise ValueError(
            f"--serving-batch-sizes {','.join(map(str, sizes))}: llama.cpp's contexts hold {slots} sequences "
            f"(--batch-size {pair.batch_size or f'default {slots}'}), so batch size {max(sizes)} cannot be "
            f"measured: give sizes up to {slots}, or --batch-size {max(sizes)}"
        )


def auto_batch_sizes(pair: PairSettings, runtime: str) -> list[int]:
    """``--serving-batch-sizes auto`` on this machine
    (``relaxtune.decoding.serving.default_batch_sizes``): llama.cpp's (a CPU's) for
    ``runtime`` llamacpp, at most its contexts' sequence slots (``--batch-size``, default
    ``BATCH_SIZE_LLAMACPP``); else a GPU's when this machine has CUDA (the transformers
    runtime loads there), else a CPU's; SGLang servers: the device the verifier server
    reports (``relaxtune.backends.sglang_costs.server_batch_sizes``)."""
    from ..decoding.serving import default_batch_sizes

    if pair.verifier_url:
        from ..backends.sglang_costs import server_batch_sizes

        return list(server_batch_sizes(pair.verifier_url))
    if runtime == "llamacpp":
        from ..backends.llamacpp import BATCH_SIZE_LLAMACPP

        slots = pair.batch_size or BATCH_SIZE_LLAMACPP
        return [b for b in default_batch_sizes("llamacpp") if b <= slots]
    import torch

    return list(default_batch_sizes("cuda" if torch.cuda.is_available() else "cpu"))


def study_name(task: str, method: str, pair: str, version: int = 1) -> str:
    """``<task>__<method>__<pair>`` (pair sanitised), with ``-v<version>`` after the
    task from version 2 on, so a new task version starts fresh studies."""
    task = task if version == 1 else f"{task}-v{version}"
    return f"{task}__{method}__{re.sub(r'[^A-Za-z0-9._-]+', '_', pair)}"


# settings that change what a trial measures or how it is judged: jobs that differ in one never share MLflow runs
JOB_FIELDS = (
    "limit",
    "seed",
    "n_drafts",
    "stage_size",
    "c_rel",
    "epsilon",
    "confidence",
    "max_length_ratio",
    "max_truncated",
)
# the same, entering the id only when given (what prices the search: a job of the defaults keeps the id it had)
JOB_FIELDS_GIVEN = ("serving_batch_size", "serving_batch_weights")


def spec_digest(spec) -> str:
    """SHA-256 (hex, 16 digits) of a task spec's content (``TaskSpec``; the file's path left out)."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:16]


def job_id(settings: TuneSettings, spec, pair: str) -> str:
    """The tuning job's id: ``settings.job_id`` when given, else ``<task>-<12 hex digits>``, a digest of
    the Optuna storage (password left out), the task spec, the model pair, ``JOB_FIELDS`` and those of
    ``JOB_FIELDS_GIVEN`` given. Every
    worker of one job computes the same id (neither the output folder, the server URLs nor the number
    of trials enter it); a job with other settings gets another."""
    if settings.stores.job_id:
        return settings.stores.job_id
    from sqlalchemy.engine import make_url

    storage = make_url(storage_url(settings.stores)).render_as_string(hide_password=True)
    flat = settings.model_dump()
    key = {"storage": storage, "spec": spec_digest(spec), "pair": pair} | {f: flat[f] for f in JOB_FIELDS}
    key |= {f: flat[f] for f in JOB_FIELDS_GIVEN if flat[f] is not None}
    return f"{spec.name}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]}"
