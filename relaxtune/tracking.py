"""MLflow tracking of a tuning job.

Run layout (experiment ``relaxtune-<task>``):

    <task>__<pair>                 task run: dataset input, combined figure of every
    |                              method's Pareto front, the tuned config (artifact)
    +-- <task>__<method>__<pair>   study run: Pareto figure + table, chosen point
        +-- trial-<n>              trial run: params (method, knob, n_draft, task
                                   version), metrics, per-sample table

Metrics are logged with ``step = trial number`` on the study run too, so the
MLflow UI charts a study's progress. Every run carries the tuning job's id
(``relaxtune.settings.job_id``) and is found again by tags (kind, job, study,
trial number), never by name: a restart or another worker of the same job finds
the same runs, a job with other settings never writes into them. Runs are
created under the storage's lock (``relaxtune.studies.storage_lock``), so
workers starting together create each run once. Re-logging a table or a figure
replaces it. The tracker never starts an MLflow run, so it works inside one the
caller has active. The default store is ``sqlite:///mlflow.db`` (MLflow 3
refuses the ``./mlruns`` file store); many workers share a tracking server
(``mlflow server`` on a PostgreSQL backend store). Params are write-once and
truncated at 6000 characters, so the config goes in as an artifact, never as a param.
"""

from __future__ import annotations

import json
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from .methods import get_method
from .pareto import Point, combined_figure, front_figure, points_table, study_points

__all__ = ["Tracker", "DEFAULT_URI", "filter_literal", "experiment_id", "find_runs", "log_table"]

DEFAULT_URI = "sqlite:///mlflow.db"
SAMPLE_COLUMNS = ("problem_id", "repeat", "seed", "verdict", "correct", "extracted", "finish_reason",
                  "response_tokens", "output")


class Tracker:
    """Logs a tuning job to MLflow (see the module doc for the run layout).

    Args:
        uri: tracking URI (default ``sqlite:///mlflow.db``).
        task: the task spec; pair: the pair's name; settings: a dict of the job's settings.
        problems: the problems (logged as the dataset input).
        job_id: the tuning job's id (``relaxtune.settings.job_id``).
        lock: a context-manager factory that serialises run creation across the
            job's workers (``relaxtune.studies.storage_lock(storage_url)``); default none.
    """

    def __init__(self, uri: str | None, task, pair: str, settings: dict, problems, job_id: str, lock=None) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri or DEFAULT_URI
        self.client = MlflowClient(self.uri)
        self.task, self.pair, self.job_id = task, pair, job_id
        self._lock = lock or nullcontext
        self.study_runs: dict[str, str] = {}
        self.studies: dict[str, str] = {}
        self.points: dict[str, list[Point]] = {}
        with self._lock():  # the first client of a new store creates its tables
            self.experiment_id = experiment_id(self.client, f"relaxtune-{task.name}")
            self.task_run_id = self._run(f"{task.name}__{pair}", None, {"relaxtune.kind": "task"},
                                         {"relaxtune.task_version": str(task.version)})
            if not self.client.get_run(self.task_run_id).inputs.dataset_inputs:
                self._log_dataset(problems)
        self.client.log_dict(self.task_run_id, settings, "settings.json")

    def _find(self, tags: dict[str, str]):
        """Active runs of the experiment carrying every tag in ``tags``, oldest first."""
        return find_runs(self.client, self.experiment_id, tags)

    def _run(self, name: str, parent: str | None, key: dict, tags: dict | None = None) -> str:
        """The run identified by ``key`` tags and this job (resumed), or a new one named ``name``."""
        key = {**key, "relaxtune.job": self.job_id}
        found = self._find(key)
        if not found:
            with self._lock():  # looked for again: another worker may have just created it
                found = self._find(key)
                if not found:
                    all_tags = {"mlflow.runName": name, **key, **(tags or {})}
                    all_tags |= {"mlflow.parentRunId": parent} if parent else {}
                    return self.client.create_run(self.experiment_id, tags=all_tags, run_name=name).info.run_id
        self.client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id

    def _log_dataset(self, problems) -> None:
        """The problems as the task run's dataset input, through the client (``mlflow.log_input``
        needs the run active in this thread, which would clash with a caller's active run)."""
        import mlflow
        import pandas as pd
        from mlflow.entities import DatasetInput, InputTag

        df = pd.DataFrame([{"id": p.id, "prompt": p.prompt, "gold": json.dumps(p.gold) if isinstance(p.gold, dict) else p.gold}
                           for p in problems])
        dataset = mlflow.data.from_pandas(df, name=f"{self.task.name}-v{self.task.version}")
        context = InputTag("mlflow.data.context", "tuning")  # what mlflow.log_input(context=...) writes
        entity = dataset._to_mlflow_entity()  # what mlflow.log_input sends
        self.client.log_inputs(self.task_run_id, [DatasetInput(entity, [context])])

    def _log_table(self, run_id: str, rows: list[dict], artifact_file: str) -> None:
        """``log_table`` under the job's lock."""
        log_table(self.client, run_id, rows, artifact_file, self._lock)

    # ------------------------------------------------------------------ studies

    def start_study(self, method: str, study) -> str:
        """The study's run (created or resumed); returns its id."""
        key = {"relaxtune.kind": "study", "relaxtune.study": study.study_name}
        run_id = self._run(study.study_name, self.task_run_id, key, {"relaxtune.method": method})
        self.study_runs[method], self.studies[method] = run_id, study.study_name
        spec = get_method(method)
        existing = self.client.get_run(run_id).data.params
        for key, value in {"method": method, "knob_name": spec.knob or "-", "study_name": study.study_name,
                           "task_version": self.task.version, "pair": self.pair}.items():
            if key not in existing:
                self.client.log_param(run_id, key, value)
        return run_id

    def log_trial(self, method: str, number: int, params: dict, metrics: dict, state: str, result,
                  note: str | None = None) -> None:
        """The nested run of trial ``number`` (found by study, number and job); metrics also on
        the study run at ``step = number``; ``note`` (e.g. why it failed) as a tag."""
        parent = self.study_runs[method]
        key = {"relaxtune.kind": "trial", "relaxtune.study": self.studies[method], "relaxtune.trial": str(number)}
        run_id = self._run(f"trial-{number}", parent, key)
        from mlflow.entities import Metric, Param, RunTag

        logged = self.client.get_run(run_id).data.params
        wanted = {"method": method, "knob": params.get("knob", "-"), "n_draft": params["n_draft"],
                  "task_version": self.task.version}
        tags = {"relaxtune.state": state} | ({"relaxtune.note": note[:5000]} if note else {})
        now = int(time.time() * 1000)
        values = [Metric(k, float(v), now, number) for k, v in metrics.items() if isinstance(v, (int, float))]
        # one request per run (a shared tracking server sees one call, not one per metric)
        params = [Param(k, str(v)) for k, v in wanted.items() if k not in logged]
        self.client.log_batch(run_id, metrics=values, params=params, tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.log_batch(parent, metrics=values)
        if result is not None and result.records:
            rows = [{k: r.get(k) for k in SAMPLE_COLUMNS} for r in result.records]
            self._log_table(run_id, rows, "samples.json")
        self.client.set_terminated(run_id, status="FINISHED" if state == "COMPLETE" else "KILLED" if state == "PRUNED" else "FAILED")

    def log_confirmation(self, method: str, confirmation) -> None:
        """A method's confirmation on its study run: every attempt as ``confirmation.json``,
        the search and confirmation bounds of the last attempt as metrics (``search_drop_ucb``,
        ``confirm_drop_ucb`` at ``confirm_confidence``) and the outcome as a tag."""
        run_id = self.study_runs[method]
        attempts = [a.summary() for a in confirmation.attempts]
        self.client.log_dict(run_id, {"confidence": confirmation.confidence, "planned": confirmation.planned,
                                      "attempts": attempts, "missing": confirmation.missing}, "confirmation.json")
        if attempts:
            last = attempts[-1]
            for key, value in {"search_drop_ucb": last["search_drop_upper_bound"],
                               "confirm_drop_ucb": last["drop_upper_bound"], "confirm_confidence": last["confidence"],
                               "confirm_accuracy": last["accuracy"], "confirm_strict_accuracy": last["strict_accuracy"],
                               "confirm_n": last["n"], "confirm_attempts": len(attempts)}.items():
                self.client.log_metric(run_id, key, float(value))
        done = confirmation.confirmed
        self.client.set_tag(run_id, "relaxtune.confirmed",
                            f"trial {done.trial} (attempt {done.attempt})" if done else "none (failed or not run)")

    def baseline_points(self, tuner) -> list[Point]:
        """AR at speed-up 1 and strict at every evaluated N."""
        out = []
        for n, b in sorted(tuner.baselines.items()):
            out.append(Point(f"strict N={n}", "strict", tuner.strict_speedup(n), b.accuracy, n_draft=n, method="strict"))
        if tuner.baselines:
            acc = next(iter(tuner.baselines.values())).accuracy
            out.append(Point("AR", "ar", 1.0, acc, method="ar"))
        return out

    def finish_study(self, outcome, tuner) -> None:
        """The study's Pareto figure and table, and its chosen point."""
        import matplotlib.pyplot as plt

        method, study = outcome.method, outcome.study
        run_id = self.study_runs[method]
        spec = get_method(method)
        chosen = outcome.chosen.number if outcome.chosen is not None else None
        points = study_points(method, spec.knob, study, chosen, tuner.settings)
        self.points[method] = points
        everything = points + self.baseline_points(tuner)
        fig = front_figure(everything, f"{self.task.name}: {method} (epsilon {tuner.settings.epsilon:g})")
        self.client.log_figure(run_id, fig, "pareto_front.png")
        plt.close(fig)
        self._log_table(run_id, points_table(everything), "pareto_front.json")
        self.client.set_tag(run_id, "relaxtune.chosen_trial", str(chosen) if chosen is not None else "none (use strict)")
        self.client.log_metric(run_id, "tokens_spent", float(outcome.tokens))
        self.client.set_terminated(run_id)

    def finish_task(self, tuner, config_path: Path) -> None:
        """The combined figure of every method's front and the tuned config."""
        import matplotlib.pyplot as plt

        fig = combined_figure(self.points, self.baseline_points(tuner), f"{self.task.name}: Pareto fronts by method")
        self.client.log_figure(self.task_run_id, fig, "pareto_fronts_by_method.png")
        plt.close(fig)
        self.client.log_artifact(self.task_run_id, str(config_path))
        self.client.set_terminated(self.task_run_id)


def experiment_id(client, name: str) -> str:
    """The id of the experiment ``name``, created when missing."""
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else client.create_experiment(name)


def find_runs(client, experiment_id: str, tags: dict[str, str]) -> list:
    """Active runs of an experiment carrying every tag in ``tags`` (values compared
    exactly, quotes included: ``filter_literal``), oldest first."""
    clauses = [f"tags.`{k}` = {q}" for k, v in tags.items() if (q := filter_literal(v)) is not None]
    runs = client.search_runs([experiment_id], filter_string=" and ".join(clauses),
                              order_by=["attributes.start_time ASC"])
    return [r for r in runs if all(r.data.tags.get(k) == v for k, v in tags.items())]


def log_table(client, run_id: str, rows: list[dict], artifact_file: str, lock=nullcontext) -> None:
    """``MlflowClient.log_table``, but replacing the table (log_table appends to an
    existing one); ``lock`` guards the read-modify-write of the run's table tag
    (workers finishing the same study at once)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(artifact_file).name
        _frame(rows).to_json(path, orient="split", index=False, date_format="iso")  # log_table's format
        parent = str(Path(artifact_file).parent)
        client.log_artifact(run_id, str(path), None if parent == "." else parent)
    entry = {"path": artifact_file, "type": "table"}
    with lock():
        logged = json.loads(client.get_run(run_id).data.tags.get("mlflow.loggedArtifacts", "[]"))
        if entry not in logged:  # how the UI knows a table
            client.set_tag(run_id, "mlflow.loggedArtifacts", json.dumps(logged + [entry]))


def _frame(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows)


def filter_literal(value: str) -> str | None:
    """``value`` as a string literal of an MLflow search filter, or None when it
    cannot be one. MLflow strips the outer quotes and never unescapes, so a value
    with a single quote goes in double quotes and vice versa; one with both has no
    literal (match it after the search)."""
    if "'" not in value:
        return f"'{value}'"
    return f'"{value}"' if '"' not in value else None
