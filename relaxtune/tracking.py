"""MLflow tracking of a tuning job.

Run layout (experiment ``relaxtune-<task>``):

    <task>__<pair>                 task run: dataset input, combined figure of every
    |                              method's Pareto front, the tuned config (artifact)
    +-- <task>__<method>__<pair>   study run: Pareto figure + table, chosen point
        +-- trial-<n>              trial run: params (method, knob, n_draft, task
                                   version), metrics, per-sample table

Metrics are logged with ``step = trial number`` on the study run too, so the
MLflow UI charts a study's progress. Runs are found again by tags on restart
(no duplicates). The default store is ``sqlite:///mlflow.db`` (MLflow 3 refuses
the ``./mlruns`` file store). Params are write-once and truncated at 6000
characters, so the config goes in as an artifact, never as a param.
"""

from __future__ import annotations

import json
from pathlib import Path

from .methods import get_method
from .pareto import Point, combined_figure, front_figure, points_table, study_points

__all__ = ["Tracker", "DEFAULT_URI"]

DEFAULT_URI = "sqlite:///mlflow.db"
SAMPLE_COLUMNS = ("problem_id", "repeat", "seed", "verdict", "correct", "extracted", "finish_reason",
                  "response_tokens", "output")


class Tracker:
    """Logs a tuning job to MLflow (see the module doc for the run layout).

    Args:
        uri: tracking URI (default ``sqlite:///mlflow.db``).
        task: the task spec; pair: the pair's name; settings: a dict of the job's settings.
        problems: the problems (logged as the dataset input).
    """

    def __init__(self, uri: str | None, task, pair: str, settings: dict, problems) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = uri or DEFAULT_URI
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(self.uri)
        self.task, self.pair = task, pair
        name = f"relaxtune-{task.name}"
        exp = self.client.get_experiment_by_name(name)
        self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(name)
        self.task_run_id = self._run(f"{task.name}__{pair}", None, {"relaxtune.kind": "task", "relaxtune.task_version": str(task.version)})
        self.study_runs: dict[str, str] = {}
        self.points: dict[str, list[Point]] = {}
        if not self.client.get_run(self.task_run_id).inputs.dataset_inputs:
            self._log_dataset(problems)
        self.client.log_dict(self.task_run_id, settings, "settings.json")

    def _run(self, name: str, parent: str | None, tags: dict) -> str:
        """Find the run with this name under ``parent`` (resume) or create it."""
        filt = f"tags.`mlflow.runName` = '{name}'" + (f" and tags.`mlflow.parentRunId` = '{parent}'" if parent else "")
        found = self.client.search_runs([self.experiment_id], filter_string=filt, max_results=1)
        if found:
            self.client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id
        all_tags = {"mlflow.runName": name, **tags} | ({"mlflow.parentRunId": parent} if parent else {})
        return self.client.create_run(self.experiment_id, tags=all_tags, run_name=name).info.run_id

    def _log_dataset(self, problems) -> None:
        import mlflow
        import pandas as pd

        df = pd.DataFrame([{"id": p.id, "prompt": p.prompt, "gold": json.dumps(p.gold) if isinstance(p.gold, dict) else p.gold}
                           for p in problems])
        dataset = mlflow.data.from_pandas(df, name=f"{self.task.name}-v{self.task.version}")
        with mlflow.start_run(run_id=self.task_run_id):
            mlflow.log_input(dataset, context="tuning")

    # ------------------------------------------------------------------ studies

    def start_study(self, method: str, study) -> str:
        """The study's run (created or resumed); returns its id."""
        run_id = self._run(study.study_name, self.task_run_id, {"relaxtune.kind": "study", "relaxtune.method": method})
        self.study_runs[method] = run_id
        spec = get_method(method)
        existing = self.client.get_run(run_id).data.params
        for key, value in {"method": method, "knob_name": spec.knob or "-", "study_name": study.study_name,
                           "task_version": self.task.version, "pair": self.pair}.items():
            if key not in existing:
                self.client.log_param(run_id, key, value)
        return run_id

    def log_trial(self, method: str, number: int, params: dict, metrics: dict, state: str, result) -> None:
        """A nested run for one trial; metrics also on the study run at ``step = number``."""
        parent = self.study_runs[method]
        run_id = self._run(f"trial-{number}", parent, {"relaxtune.kind": "trial", "relaxtune.state": state})
        self.client.set_tag(run_id, "relaxtune.state", state)
        logged = self.client.get_run(run_id).data.params
        for key, value in {"method": method, "knob": params.get("knob", "-"), "n_draft": params["n_draft"],
                           "task_version": self.task.version}.items():
            if key not in logged:
                self.client.log_param(run_id, key, value)
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self.client.log_metric(run_id, key, float(value), step=number)
                self.client.log_metric(parent, key, float(value), step=number)
        if result is not None and result.records:
            rows = [{k: r.get(k) for k in SAMPLE_COLUMNS} for r in result.records]
            self.client.log_table(run_id, data=_frame(rows), artifact_file="samples.json")
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
        self.client.log_table(run_id, data=_frame(points_table(everything)), artifact_file="pareto_front.json")
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


def _frame(rows: list[dict]):
    import pandas as pd

    return pd.DataFrame(rows)
