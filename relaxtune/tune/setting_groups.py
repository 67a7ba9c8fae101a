"""The groups of a tuning job's settings, each a pydantic model with its fields' one
default and one description and their checks: the model pair and where it runs
(``PairSettings``), what the job certifies and how, the serving batch sizes it prices at
included (``StatsSettings``), what the search tries (``SearchSettings``), where the job
keeps what it makes (``StoreSettings``) and how this worker runs (``WorkerSettings``).
``relaxtune.tune.settings.TuneSettings`` holds them and reads and writes them under flat
names.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..backends.embedded import DRAFTER, VERIFIER
from ..decoding.methods import get_method
from .store_uris import check_storage_uri, check_tracking_uri

__all__ = [
    "PairSettings",
    "StatsSettings",
    "SearchSettings",
    "StoreSettings",
    "WorkerSettings",
    "DTYPES",
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
        items = [v.strip() for v in sizes.split(",")]
        if not any(items) or "" in items:
            raise ValueError(f"{sizes!r} has an empty item: give auto or e.g. 1,4,16")
        bad = [v for v in items if not v.lstrip("-").isdigit()]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an integer: give auto or e.g. 1,4,16")
        return [int(v) for v in items]

    @field_validator("serving_batch_sizes")
    @classmethod
    def _positive_batch_sizes(cls, sizes):
        if sizes != "auto" and (not sizes or any(b < 1 for b in sizes)):
            raise ValueError(f"serving_batch_sizes must be integers >= 1, got {sizes}")
        if sizes != "auto" and len(set(sizes)) < len(sizes):
            twice = sorted({b for b in sizes if sizes.count(b) > 1})
            raise ValueError(f"batch size {twice[0]} is given twice: give each size once")
        return sizes if sizes == "auto" else sorted(sizes)

    @field_validator("serving_batch_weights", mode="before")
    @classmethod
    def _weights_text(cls, weights):
        """A flag's text: comma-separated ``<batch size>=<weight>`` pairs."""
        if not isinstance(weights, str):
            return weights
        out = {}
        items = [v.strip() for v in weights.split(",")]
        if any(items) and "" in items:
            raise ValueError(f"{weights!r} has an empty item: give e.g. 1=0.2,16=0.8")
        for item in (v for v in items if v):
            size, eq, weight = (t.strip() for t in item.partition("="))
            if size.isdigit() and int(size) in out:
                raise ValueError(f"batch size {int(size)} is given twice: give each size once")
            try:
                if not eq or not size.isdigit():
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
    relaxation_scope: Literal["all", "thinking", "both"] = Field(
        "all",
        description="where relaxed rules relax: all (every position), thinking (inside <think>...</think> only, "
        "strict in the answer; thinking tasks only) or both (searched as a dimension)",
    )
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
