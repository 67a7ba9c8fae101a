"""MLflow logging of a transfer matrix (``relaxtune.transfer``).

One ``transfer`` run in each task's experiment (``relaxtune-<task>``) and one in
the cross-task experiment ``relaxtune-transfer``, each with the heatmap
(``transfer_matrix.png``), the table of every cell (``transfer_matrix.json``)
and the run's parameters; a task's run holds the metrics of the cells judged on
it (``<method>/<source>/drop_ucb``, ``.../within``, ``.../speedup``, ``.../n``),
the cross-task run those of every cell (``<method>/<source>/<target>/...``).
Runs are found again by tags (kind ``transfer`` and the matrix's key), so a
transfer run again with the same tuned configs and settings replaces its figure
and table; new tuned configs make new runs.
"""

from __future__ import annotations

import re
import time

from ..report.mlflow_runs import DEFAULT_URI, experiment_id, find_runs, log_table

__all__ = ["log_transfer", "CROSS_EXPERIMENT"]

CROSS_EXPERIMENT = "relaxtune-transfer"


def _metric_name(*parts: str) -> str:
    """MLflow metric names take letters, digits, ``_ - . / `` and spaces."""
    return "/".join(re.sub(r"[^A-Za-z0-9_.\- ]", "_", p) for p in parts)


def _metrics(cells, with_target: bool) -> dict[str, float]:
    out = {}
    for c in cells:
        head = (c.method, c.source) + ((c.target,) if with_target else ())
        out[_metric_name(*head, "within")] = float(c.within)
        for key, name in (("drop_ucb", "drop_ucb"), ("speedup", "speedup"), ("n", "n")):
            if key in c.metrics:
                out[_metric_name(*head, name)] = float(c.metrics[key])
    return out


def log_transfer(matrix, uri: str | None = None) -> dict[str, dict]:
    """Log ``matrix`` (module doc for the runs) and return, per task name, where its
    transfer run is: ``{tracking_uri, experiment, run_id, cross_experiment, cross_run_id}``."""
    import matplotlib.pyplot as plt
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from .figure import matrix_figure

    uri = uri or DEFAULT_URI
    client = MlflowClient(uri)
    name = "transfer__" + "+".join(matrix.tasks)
    params = {
        "tasks": ",".join(matrix.tasks),
        "methods": ",".join(matrix.methods),
        "pair": matrix.pair,
        "confidence": matrix.confidence,
        "confidence_each": matrix.confidence_each,
        "cells": len(matrix.cells),
    }
    fig = matrix_figure(matrix)
    rows = matrix.rows()
    runs = {}
    try:
        for experiment, tasks in [(f"relaxtune-{t}", [t]) for t in matrix.tasks] + [(CROSS_EXPERIMENT, None)]:
            exp = experiment_id(client, experiment)
            key = {"relaxtune.kind": "transfer", "relaxtune.transfer": matrix.key}
            found = find_runs(client, exp, key)
            run_id = found[0].info.run_id if found else client.create_run(exp, tags=key, run_name=name).info.run_id
            client.update_run(run_id, status="RUNNING")
            cells = [c for c in matrix.cells if tasks is None or c.target in tasks]
            logged = client.get_run(run_id).data.params  # params are write-once
            now = int(time.time() * 1000)
            client.log_batch(
                run_id,
                metrics=[Metric(k, v, now, 0) for k, v in _metrics(cells, tasks is None).items()],
                params=[Param(k, str(v)) for k, v in params.items() if k not in logged],
                tags=[RunTag("relaxtune.tasks", params["tasks"])],
            )
            client.log_figure(run_id, fig, "transfer_matrix.png")
            log_table(client, run_id, rows, "transfer_matrix.json")
            client.set_terminated(run_id)
            runs[experiment] = run_id
    finally:
        plt.close(fig)
    return {
        t: {
            "tracking_uri": uri,
            "experiment": f"relaxtune-{t}",
            "run_id": runs[f"relaxtune-{t}"],
            "cross_experiment": CROSS_EXPERIMENT,
            "cross_run_id": runs[CROSS_EXPERIMENT],
        }
        for t in matrix.tasks
    }
