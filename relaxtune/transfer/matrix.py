"""The cells of a transfer matrix (``relaxtune.transfer``), the matrix, and the
``transfer`` sections they give the tuned configs (``relaxtune.report.config_schema.Transfer``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..report.config_schema import Transfer, TransferCell
from ..report.export import load_config, save_config

__all__ = ["Cell", "TransferMatrix", "sections", "write_sections", "RULE"]

RULE = (
    "Bonferroni: the confidence c is split evenly over the K cells judged (methods x sources with a confirmed "
    "point x targets, the diagonal included); each is judged at 1 - (1 - c) / K, so every cell marked within "
    "epsilon holds at once with confidence c"
)


@dataclass
class Cell:
    """``source``'s confirmed point of ``method`` judged on ``target``.

    Attributes:
        method, source, target: task names; knob, n_draft: the point.
        samples: "confirmation" (the diagonal) or "search"; seed: their base seed;
            problems: how many problems (x the target's repeats).
        epsilon: the target's; confidence: one-sided, after the split.
        metrics: ``relaxtune.tune.judge.point_metrics`` on the target (``drop_ucb`` at
            ``confidence``, ``speedup`` at the target's costs); empty when the
            evaluation failed.
        within: every constraint of the target holds.
        error: why the evaluation failed, or None.
    """

    method: str
    source: str
    target: str
    knob: float | None
    n_draft: int
    samples: str
    seed: int
    problems: int
    epsilon: float
    confidence: float
    metrics: dict = field(default_factory=dict)
    within: bool = False
    error: str | None = None

    def exported(self) -> TransferCell:
        """The cell as the tuned configs show it."""
        m = self.metrics
        return TransferCell(
            knob=self.knob,
            n_draft=self.n_draft,
            within_epsilon=self.within,
            epsilon=self.epsilon,
            drop_upper_bound=m.get("drop_ucb"),
            drop=m.get("drop"),
            n=m.get("n"),
            problems=self.problems,
            seed=self.seed,
            samples=self.samples,
            accuracy=m.get("accuracy"),
            strict_accuracy=m.get("strict_accuracy"),
            modeled_speedup=m.get("speedup"),
            error=self.error,
        )

    def row(self) -> dict:
        """One row of the transfer table: the exported cell, where it sits, and how it was bounded."""
        m = self.metrics
        return (
            {"method": self.method, "source": self.source, "target": self.target}
            | self.exported().model_dump()
            | {
                "confidence": self.confidence,
                "bound_method": m.get("bound_method"),
                "l_accept": m.get("l_accept"),
                "length_ratio": m.get("length_ratio"),
            }
        )


@dataclass
class TransferMatrix:
    """Every cell of a transfer run.

    Attributes:
        tasks: task names, rows and columns in this order; methods: one matrix each.
        confidence: the family's one-sided confidence; confidence_each: each cell's.
        cells: judged cells (a source without a confirmed point has none in its row).
        pair: the model pair; key: the run's identity (tasks, methods, confidence,
            pair and each tuned config's version and creation time).
    """

    tasks: list[str]
    methods: list[str]
    confidence: float
    confidence_each: float
    cells: list[Cell]
    pair: str
    key: str

    def cell(self, method: str, source: str, target: str) -> Cell | None:
        """The cell, or None when ``source`` has no confirmed point of ``method``."""
        return next((c for c in self.cells if (c.method, c.source, c.target) == (method, source, target)), None)

    def rows(self) -> list[dict]:
        """The transfer table: one row per cell."""
        return [c.row() for c in self.cells]


def sections(matrix: TransferMatrix, mlflow: dict[str, dict] | None = None) -> dict[str, Transfer]:
    """Task name -> the ``transfer`` section of its tuned config (``mlflow``: task
    name -> where its transfer run is)."""
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    out = {}
    for name in matrix.tasks:
        sources: dict[str, dict[str, TransferCell]] = {}
        targets: dict[str, dict[str, TransferCell]] = {}
        for c in matrix.cells:
            if c.target == name:
                sources.setdefault(c.source, {})[c.method] = c.exported()
            elif c.source == name:
                targets.setdefault(c.target, {})[c.method] = c.exported()
        out[name] = Transfer(
            tasks=matrix.tasks,
            confidence=matrix.confidence,
            confidence_each=matrix.confidence_each,
            cells=len(matrix.cells),
            rule=RULE,
            sources=sources,
            targets=targets,
            created=created,
            mlflow=(mlflow or {}).get(name),
        )
    return out


def write_sections(
    tuned: dict, parts: dict[str, Transfer], log: Callable[[str], None] = lambda message: None
) -> list[Path]:
    """Write each task's ``transfer`` section into its tuned config (``tuned``: task
    name -> ``relaxtune.transfer.run.TunedTask``; the file is read again first, and one
    tuned again since the transfer read it is left alone, and said so). Returns
    the files written."""
    written = []
    for name, part in parts.items():
        task = tuned[name]
        current = load_config(task.path)
        if current.created != task.config.created:
            log(
                f"{task.path} changed during the transfer (tuned again?): its transfer section is not written; run "
                "`relaxtune transfer` again"
            )
            continue
        written.append(save_config(current.model_copy(update={"transfer": part}), task.path))
    return written
