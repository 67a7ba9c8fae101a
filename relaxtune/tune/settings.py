"""The settings of a tuning job (CLI flags and ``--config`` YAML keys), study names and job ids."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..backends.embedded import DRAFTER, VERIFIER
from ..backends.load import resolve_runtime
from ..decoding.methods import get_method
from .store_uris import check_storage_uri, check_tracking_uri

__all__ = ["TuneSettings", "study_name", "job_id", "spec_digest"]


class TuneSettings(BaseModel):
    """Everything a tuning job needs (CLI flags and ``--config`` YAML keys)."""

    model_config = ConfigDict(extra="forbid")

    task: str
    methods: list[str] = ["cactus", "mentored"]
    drafter: str = DRAFTER.name
    verifier: str = VERIFIER.name
    dtype: str = "bfloat16"
    runtime: Literal["auto", "hf", "llamacpp"] = Field(
        "auto", description="in-process backend: transformers (hf) or llama.cpp on GGUF files (llamacpp: pip install "
        "'relaxtune[llamacpp]'); auto: llamacpp for the embedded pair when installed, else hf (resolved on load)")
    drafter_url: str | None = Field(None, description="SGLang drafter server (with verifier_url: SGLang backend)")
    verifier_url: str | None = Field(None, description="SGLang verifier server")
    tokenizer: str | None = Field(None, description="tokenizer id/folder for SGLang (default: the verifier id)")
    native_url: str | None = Field(None, description="STANDALONE speculative SGLang server running sglang_threshold")
    concurrency: int = Field(8, ge=1, description="sequences in flight against SGLang servers")
    batch_size: int | None = Field(None, ge=1, description="sequences the in-process engine runs together "
                                   "(default: 8 on a CPU, 32 on a GPU; 1: one at a time)")
    epsilon: float = Field(0.05, ge=0.0, le=1.0, description="allowed accuracy drop vs strict")
    confidence: float = Field(0.9, gt=0.5, lt=1.0, description="one-sided confidence of the drop bound")
    c_rel: float | Literal["measured"] = Field("measured", description="drafter/verifier cost ratio, or measured")
    remeasure_costs: bool = Field(False, description="measure the cost profile anew and replace the saved one")
    n_drafts: list[int] = [3, 5, 10, 20]
    trials: int = Field(8, ge=1, description="completed or pruned trials per method")
    limit: int | None = Field(None, ge=1, description="first N problems only")
    seed: int = 0
    stage_size: int = Field(4, ge=1, description="problems per evaluation stage (pruning granularity)")
    output_dir: str = "relaxtune-runs"
    storage: str | None = Field(None, description="Optuna RDB URL; default sqlite:///<output_dir>/optuna.db")
    mlflow_uri: str | None = Field(None, description="MLflow tracking URI; default sqlite:///mlflow.db")
    max_length_ratio: float | None = Field(None, gt=0, description="optional guard: L_relax / L_strict")
    max_truncated: float | None = Field(None, ge=0, le=1, description="optional guard: truncated share")
    export: str | None = Field(None, description="tuned config path; default <output_dir>/<task>.tuned.yaml")
    parallel_trials: int = Field(1, ge=1, description="trials this worker runs at once (threads, or Prefect task "
                                 "runs), taken from the methods' queues in order")
    heartbeat: int = Field(30, ge=1, description="seconds between heartbeats of a running trial")
    grace_period: int | None = Field(None, ge=1, description="seconds without a heartbeat before a running trial "
                                     "counts as stale and is retried once; default 4 x heartbeat")
    range_size: int | None = Field(None, ge=1, description="problems per evaluation range: ranges run as separate "
                                   "task runs (Prefect) or are shared among workers (strict), then merge")
    job_id: str | None = Field(None, description="the tuning job's id in MLflow (every worker of one job shares it); "
                               "default: a digest of the storage, the task and the settings that shape trials")
    confirm: Literal["seeds", "holdout"] = Field(
        "holdout", description="confirmation samples: a held-out half of the problems, split before any generation "
        "(the promise is about problems like these), or fresh seeds on the search's problems (about these problems, "
        "not new ones)")
    confirmations: int = Field(2, ge=1, description="points confirmed at most per method (the confidence is split)")

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

    @field_validator("storage")
    @classmethod
    def _storage_form(cls, storage: str | None) -> str | None:
        return None if storage is None else check_storage_uri(storage)

    @field_validator("mlflow_uri")
    @classmethod
    def _tracking_form(cls, uri: str | None) -> str | None:
        return None if uri is None else check_tracking_uri(uri)

    @property
    def mid_n_draft(self) -> int:
        """The middle draft length of ``n_drafts`` (the paper's grid runs there first)."""
        return self.n_drafts[(len(self.n_drafts) - 1) // 2]

    @field_validator("c_rel")
    @classmethod
    def _finite_c_rel(cls, c_rel):
        if c_rel != "measured" and not (math.isfinite(c_rel) and c_rel >= 0):
            raise ValueError(f"c_rel must be a finite number >= 0 or 'measured', got {c_rel}")
        return c_rel

    @field_validator("n_drafts")
    @classmethod
    def _positive_drafts(cls, n_drafts: list[int]) -> list[int]:
        if not n_drafts or any(n < 1 for n in n_drafts):
            raise ValueError(f"n_drafts must be integers >= 1, got {n_drafts}")
        return sorted(set(n_drafts))

    @model_validator(mode="after")
    def _resolve_runtime(self):
        """``auto`` becomes the runtime it means here, so records, studies and a saved job name it."""
        self.runtime = resolve_runtime(self.runtime, self.drafter, self.verifier, self.drafter_url, self.verifier_url)
        return self

    @model_validator(mode="after")
    def _grace_after_heartbeat(self):
        if self.grace_period is not None and self.grace_period <= self.heartbeat:
            raise ValueError(f"grace_period ({self.grace_period} s) must exceed heartbeat ({self.heartbeat} s), or a "
                             "live trial between two heartbeats would count as stale")
        return self

    @property
    def stale_after(self) -> int:
        """Seconds without a heartbeat after which a running trial is stale (``grace_period`` or 4 x ``heartbeat``)."""
        return self.grace_period or 4 * self.heartbeat

    @property
    def backend(self) -> dict:
        """The keyword arguments of ``relaxtune.backends.load.load_backend`` (and of
        ``backend_name``, less the loading ones): the models and where they run."""
        return dict(drafter=self.drafter, verifier=self.verifier, dtype=self.dtype, batch_size=self.batch_size,
                    drafter_url=self.drafter_url, verifier_url=self.verifier_url, tokenizer=self.tokenizer,
                    concurrency=self.concurrency, native_url=self.native_url, runtime=self.runtime)

    @property
    def storage_url(self) -> str:
        """The Optuna storage URL."""
        if self.storage:
            return self.storage
        path = Path(self.output_dir).resolve() / "optuna.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"


def study_name(task: str, method: str, pair: str, version: int = 1) -> str:
    """``<task>__<method>__<pair>`` (pair sanitised), with ``-v<version>`` after the
    task from version 2 on, so a new task version starts fresh studies."""
    task = task if version == 1 else f"{task}-v{version}"
    return f"{task}__{method}__{re.sub(r'[^A-Za-z0-9._-]+', '_', pair)}"


# settings that change what a trial measures or how it is judged: jobs that differ in one never share MLflow runs
JOB_FIELDS = ("limit", "seed", "n_drafts", "stage_size", "c_rel", "epsilon", "confidence", "max_length_ratio",
              "max_truncated")


def spec_digest(spec) -> str:
    """SHA-256 (hex, 16 digits) of a task spec's content (``TaskSpec``; the file's path left out)."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:16]


def job_id(settings: TuneSettings, spec, pair: str) -> str:
    """The tuning job's id: ``settings.job_id`` when given, else ``<task>-<12 hex digits>``, a digest of
    the Optuna storage (password left out), the task spec, the model pair and ``JOB_FIELDS``. Every
    worker of one job computes the same id (neither the output folder, the server URLs nor the number
    of trials enter it); a job with other settings gets another."""
    if settings.job_id:
        return settings.job_id
    from sqlalchemy.engine import make_url

    storage = make_url(settings.storage_url).render_as_string(hide_password=True)
    key = {"storage": storage, "spec": spec_digest(spec), "pair": pair} | {f: getattr(settings, f) for f in JOB_FIELDS}
    return f"{spec.name}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]}"
