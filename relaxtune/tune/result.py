"""What a finished tuning job (or export) hands to ``report/``: a frozen result, never
the live ``Tuner`` (built by ``Tuner.result``).

Everything the tuned config, its recommendation, the MLflow runs and the figures read
is here: the job's settings that report reads (the model pair, the statistics and the
search: ``relaxtune.tune.setting_groups``; never the stores or the workers), the task,
how many problems the search and the confirmations ran on, strict's baseline at every
evaluated draft length (with its modeled speed-up), each method's outcome and
confirmation, and the cost profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from types import MappingProxyType

from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile
from ..tasks.spec import TaskSpec
from .outcomes import MethodOutcome
from .point_records import EvalResult
from .setting_groups import PairSettings, SearchSettings, StatsSettings
from .settings import TuneSettings

__all__ = ["JobResult"]


@dataclass(frozen=True)
class JobResult:
    """A finished job, read only.

    Attributes:
        spec: the task (name, version, sampling, repeats, grader).
        problems: problems the search ran on (the first half with ``--confirm holdout``).
        confirm_problems: problems the confirmations ran on.
        baselines: draft length N -> strict's ``EvalResult`` at N, by increasing N.
        strict_speedups: N -> strict's modeled speed-up at N (length ratio 1).
        outcomes: each method's ``MethodOutcome`` (its study, chosen point, MLflow run id).
        confirmations: method -> ``Confirmation`` (a method without one exports no point).
        profile: the serving profile (``ServingProfile``, weighted as the search priced), a
            single ``CostProfile``, or a bare c_rel (float).
        pinned: methods the backend serves at one point only (a native speculative server).
        pair, stats, search: the job's settings groups that report reads (copies: later
            changes of the tuner's do not show), taken from ``settings`` when it is given
            (``JobResult(settings=..., ...)``: ``Tuner.result``); the job's stores and
            workers are not kept.
    """

    spec: TaskSpec
    problems: int
    confirm_problems: int
    baselines: Mapping[int, EvalResult]
    strict_speedups: Mapping[int, float]
    outcomes: tuple[MethodOutcome, ...]
    confirmations: Mapping[str, object]  # method -> relaxtune.tune.confirm.Confirmation (confirm imports tuning)
    profile: ServingProfile | CostProfile | float
    pinned: frozenset[str]
    pair: PairSettings | None = None
    stats: StatsSettings | None = None
    search: SearchSettings | None = None
    settings: InitVar[TuneSettings | None] = None

    def __post_init__(self, settings: TuneSettings | None) -> None:
        if settings is not None:
            for group in ("pair", "stats", "search"):
                object.__setattr__(self, group, getattr(settings, group).model_copy(deep=True))
        for name in ("baselines", "strict_speedups", "confirmations"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))
        object.__setattr__(self, "outcomes", tuple(self.outcomes))
        object.__setattr__(self, "pinned", frozenset(self.pinned))

    def strict_speedup(self, n_draft: int) -> float:
        """Strict's modeled speed-up at N. Raises KeyError for an N strict did not run at."""
        return self.strict_speedups[n_draft]

    def strict_points(self) -> dict[int, tuple[float, float]]:
        """N -> (strict's modeled speed-up, accuracy), by increasing N."""
        return {n: (self.strict_speedups[n], b.accuracy) for n, b in self.baselines.items()}
