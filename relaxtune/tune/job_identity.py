"""The names a tuning job goes by: its studies' (``study_name``), its id in MLflow,
shared by every worker of one job (``job_id``), and the digest of a task spec's content
(``spec_digest``).
"""

from __future__ import annotations

import hashlib
import json
import re

from .setting_groups import SearchSettings, StatsSettings, StoreSettings
from .settings import storage_url

__all__ = ["study_name", "job_id", "spec_digest", "JOB_FIELDS", "JOB_FIELDS_GIVEN"]


def study_name(task: str, method: str, pair: str, version: int = 1, scope: str = "all") -> str:
    """``<task>__<method>__<pair>`` (pair sanitised), with ``-v<version>`` after the
    task from version 2 on, so a new task version starts fresh studies, and
    ``__scope-<scope>`` after it for a job whose ``--relaxation-scope`` is not ``all``
    (``thinking``, or ``both``: scope is then a trial parameter)."""
    task = task if version == 1 else f"{task}-v{version}"
    tail = "" if scope == "all" else f"__scope-{scope}"
    return f"{task}__{method}__{re.sub(r'[^A-Za-z0-9._-]+', '_', pair)}{tail}"


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


def job_id(stores: StoreSettings, stats: StatsSettings, search: SearchSettings, spec, pair: str) -> str:
    """The tuning job's id: ``stores.job_id`` when given, else ``<task>-<12 hex digits>``, a digest of
    the Optuna storage (``stores``; password left out), the task spec, the model pair's name, ``JOB_FIELDS``
    and those of ``JOB_FIELDS_GIVEN`` given (fields of ``stats`` and ``search``), and the relaxation scope
    when not ``all``. Every worker of one job computes the same id (neither the output folder, the server
    URLs, the workers' settings nor the number of trials enter it); a job with other settings gets another."""
    if stores.job_id:
        return stores.job_id
    from sqlalchemy.engine import make_url

    storage = make_url(storage_url(stores)).render_as_string(hide_password=True)
    flat = stats.model_dump() | search.model_dump()
    key = {"storage": storage, "spec": spec_digest(spec), "pair": pair} | {f: flat[f] for f in JOB_FIELDS}
    key |= {f: flat[f] for f in JOB_FIELDS_GIVEN if flat[f] is not None}
    if flat["relaxation_scope"] != "all":  # a job that relaxes every position keeps the id it had
        key["relaxation_scope"] = flat["relaxation_scope"]
    return f"{spec.name}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]}"
