"""Prefect flow ``transfer_matrix``: ``relaxtune transfer`` (``relaxtune.transfer.run.run_transfer``)
with each evaluation a ``generate_and_grade`` task run (cached on its inputs and
what they name, retried on transient backend errors, tagged for the backend's
concurrency limit), as the tuning flows run theirs."""

from __future__ import annotations

import functools

from prefect import flow, get_run_logger

from relaxtune.flows.params import SETTING, from_settings
from relaxtune.flows.steps import backend_tag, generate_and_grade, load_backend


@flow(name="transfer_matrix", log_prints=True)
@from_settings
def transfer_matrix(
    tasks: list[str],
    methods: list[str] | None = None,
    confidence: float | None = None,
    output_dir: str = SETTING,
    mlflow_uri: str | None = SETTING,
) -> dict:
    """Judge each task's tuned point on every other task (``relaxtune transfer``);
    returns ``{"confidence_each", "cells": the transfer table's rows, "written": the
    tuned configs that gained a transfer section}``.

    Args:
        tasks: task names or YAML paths, each tuned in output_dir
        methods: the methods judged (default: every method some task's config confirmed a point for)
        confidence: one-sided confidence that every cell marked within epsilon holds at once (default: the
            highest of the tuned configs')
    """
    from relaxtune.transfer.run import load_tuned, run_transfer

    @functools.cache
    def settings_of(task_file: str):
        return load_tuned(task_file, output_dir).settings  # the target's problems (limit) and backend

    def evaluate_fn(spec, backend, config, *, output_dir, problems, progress):
        s = settings_of(spec.source_file)
        run = generate_and_grade.with_options(tags=[backend_tag(s.pair)])
        return run(
            s.model_dump(),
            config.method,
            config.knob,
            config.n_draft,
            config.seed,
            tuple(p.id for p in problems),
            **({} if config.scope == "all" else {"scope": config.scope}),
            **({"extra": config.extra} if config.extra else {}),  # the whole point (flows.tune's runner does the same)
        )

    logger = get_run_logger()
    backend = load_backend(load_tuned(tasks[0], output_dir).settings.pair)  # the pair the task runs use
    matrix, written = run_transfer(
        tasks,
        methods,
        confidence,
        output_dir=output_dir,
        mlflow_uri=mlflow_uri,
        backend=backend,
        evaluate_fn=evaluate_fn,
        progress=False,
        log=logger.info,
    )
    return {"confidence_each": matrix.confidence_each, "cells": matrix.rows(), "written": [str(p) for p in written]}
