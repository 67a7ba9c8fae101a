"""The settings of a tuning job, declared once: the groups (model pair and runtime,
statistics, search, stores, workers: ``relaxtune.tune.setting_groups``) held by
``TuneSettings`` and read and written under today's flat names (CLI flags, ``--config``
YAML keys, Prefect flow parameters, the saved ``<task>.job.yaml``, MLflow params).

Each field holds its one default and its one description: ``relaxtune.cli.options`` makes every
command-line option from them, ``flows/`` every flow parameter. Nothing here touches the disk or
the machine: ``start`` (called where a job starts) makes the output folder and resolves the
``auto`` runtime and serving batch sizes (``relaxtune.tune.serving_sizes``), which the job then
records. The job's names (study names, job id) are ``relaxtune.tune.job_identity``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from .serving_sizes import auto_batch_sizes, check_slots
from .setting_groups import PairSettings, SearchSettings, StatsSettings, StoreSettings, WorkerSettings

__all__ = [
    "TuneSettings",
    "GROUPS",
    "field_info",
    "flat_fields",
    "storage_url",
    "start",
]

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
            check_slots(self.pair, self.stats.serving_batch_sizes, list(self.stats.serving_weights))
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
    runtime and the ``auto`` serving batch sizes (``serving_sizes.auto_batch_sizes``, with the declared
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
        check_slots(started.pair, started.stats.serving_batch_sizes, list(started.stats.serving_weights))
    return started
