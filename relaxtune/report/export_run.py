"""An export's own MLflow run (``relaxtune export``), nested under the tuning job's task run
it read (tag ``relaxtune.tuning_run``), with the same content as the task run for the export's
own budget: the decision, figures, points and config. It never writes to the tuning job's runs
(the run layout: ``relaxtune.report.tracking``).
"""

from __future__ import annotations

from pathlib import Path

from ..tune.pareto import baseline_points
from .mlflow_runs import Runs

__all__ = ["ExportRun"]


class ExportRun(Runs):
    """An export's own MLflow run, nested under the tuning run it read, which it
    never writes to (artifacts, tables, params, status).

    Args:
        uri, task, pair: as ``Tracker``.
        settings: the export's settings (a dict, logged as ``settings.json``).
        problems: the problems (the export run's dataset input).
        tuning_job: the id of the tuning job whose studies the export reads (its
            task run is found by it; None or not found: a run without a parent).
    """

    def __init__(self, uri: str | None, task, pair: str, settings: dict, problems, tuning_job: str | None) -> None:
        super().__init__(uri, task, pair)
        self.settings, self.problems, self.tuning_job = settings, problems, tuning_job
        found = self._find({"relaxtune.kind": "task", "relaxtune.job": tuning_job}) if tuning_job else []
        self.tuning_run_id = found[0].info.run_id if found else None
        self.run_id: str | None = None

    def study_run(self, study_name: str) -> str | None:
        """The tuning job's run of study ``study_name`` (read only), or None."""
        if not self.tuning_job:
            return None
        found = self._find({"relaxtune.kind": "study", "relaxtune.study": study_name, "relaxtune.job": self.tuning_job})
        return found[0].info.run_id if found else None

    def start(self) -> str:
        """Create the export's run (status RUNNING) and return its id."""
        tags = {
            "relaxtune.kind": "export",
            "relaxtune.tuning_job": self.tuning_job or "unknown",
            "relaxtune.tuning_run": self.tuning_run_id or "not found",
            "relaxtune.pair": self.pair,
            "relaxtune.task_version": str(self.task.version),
        }
        tags |= {"mlflow.parentRunId": self.tuning_run_id} if self.tuning_run_id else {}
        self.run_id = self.client.create_run(
            self.experiment_id, tags=tags, run_name=f"{self.task.name} export"
        ).info.run_id
        self.client.log_dict(self.run_id, self.settings, "settings.json")
        self._log_dataset(self.run_id, self.problems)
        return self.run_id

    def finish(self, result, config, config_path: Path) -> None:
        """The export's decision, figures, points and config on its own run; FINISHED."""
        per_method = self._points(result, config)
        name = f"{self.task.name} export eps {config.epsilon:g}"
        self._log_decision(self.run_id, name, per_method, baseline_points(result), config, config_path)
        self.client.set_terminated(self.run_id)

    def fail(self, why: str) -> None:
        """Mark the export's run FAILED, saying why (an export that stopped half-way)."""
        if self.run_id is not None:
            self.client.set_tag(self.run_id, "relaxtune.note", why[:5000])
            self.client.set_terminated(self.run_id, status="FAILED")
