"""MLflow tracking of a tuning job and of its exports.

Run layout (experiment ``relaxtune-<task>``, a model-training experiment: tag
``mlflow.experimentKind = custom_model_development``):

    <task>: use <point>                   task run: the decision as params, metrics,
    |                                     tags and a one-sentence description
    |                                     (``relaxtune.report.decision``); the combined figure,
    |                                     one Pareto and one speed-vs-knob figure per
    |                                     method (``figures/``), every point as a table,
    |                                     the best point per serving batch size as a table
    |                                     (``by_batch_size.json``) and, with more than one
    |                                     batch size, its figure (``speedup_vs_batch_size.png``),
    |                                     the tuned config, the settings, the dataset
    +-- <method> study: <knob> N=<n> chosen (<S>x)
    |   |                                 study run: its Pareto and speed-vs-knob figures,
    |   |                                 points table, chosen point, description
    |   +-- <method> <knob>=<v> N=<n>     trial run: params (method, knob, n_draft, trial,
    |                                     task version), metrics, per-sample table
    +-- <task> export eps <e>: use <point>
                                          export run (``relaxtune.report.export_run.ExportRun``):
                                          one per ``relaxtune export``, the same content for its
                                          own budget

Metrics are logged with ``step = trial number`` on the study run too, so the
MLflow UI charts a study's progress. Every run of a tuning job carries the job's
id (``relaxtune.tune.job_identity.job_id``) and is found again by tags (kind, job, study,
trial number), never by name: a restart or another worker of the same job finds
the same runs, a job with other settings never writes into them. Runs are
created, and their params and tags written, under the job's MLflow lock
(``relaxtune.tune.storage.storage_lock(storage, "mlflow")``, not the trial
queues' lock: no queue waits for a tracking server), so workers starting
together create each run once. Re-logging a table or a figure
replaces it. An export reads the tuning job's runs and never writes to them: its
own run is nested under the tuning run it read (tag ``relaxtune.tuning_run``).
The tracker never starts an MLflow run, so it works inside one the caller has
active. The default store is ``sqlite:///mlflow.db`` (MLflow 3 refuses the
``./mlruns`` file store); many workers share a tracking server (``mlflow
server`` on a PostgreSQL backend store). Params are write-once and truncated at
6000 characters, so the config goes in as an artifact; a resumed job whose
decision changed keeps its first decision in the params and says so in the tag
``relaxtune.params_note`` (tags, metrics and the description hold the latest).

MLflow 3.17's UI shows the GenAI or the model-training view by a switch it
remembers per browser, whatever the experiment's kind: ``run_url`` links carry
``?workflowType=machine_learning`` so they open on runs. What both kinds of run
share (the experiment, finding runs, replacing tables and figures, logging a
decision) is ``relaxtune.report.mlflow_runs``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..decoding.methods import get_method
from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile, c_rel_of
from ..tune.pareto import Point, baseline_points, point_label, points_table
from ..tune.recommend import cost_spread
from ..tune.stopping import on_stop
from .decision import study_summary
from .mlflow_runs import DEFAULT_URI, Runs, experiment_id, filter_literal, run_url

__all__ = ["Tracker", "DEFAULT_URI", "filter_literal", "run_url", "experiment_id"]

SAMPLE_COLUMNS = (
    "problem_id",
    "repeat",
    "seed",
    "verdict",
    "correct",
    "extracted",
    "finish_reason",
    "response_tokens",
    "output",
)


class Tracker(Runs):
    """Logs a tuning job to MLflow (see the module doc for the run layout).

    Args:
        uri: tracking URI (default ``sqlite:///mlflow.db``).
        task: the task spec; pair: the pair's name; settings: a dict of the job's settings
            (logged as ``settings.json``, read for nothing else).
        problems: the problems (logged as the dataset input).
        job_id: the tuning job's id (``relaxtune.tune.job_identity.job_id``).
        lock: a context-manager factory that serialises run creation across the
            job's workers (``relaxtune.tune.storage.storage_lock(storage_url, "mlflow")``); default none.
        finish_lock: one that serialises ``finish`` across the workers without holding
            ``lock`` while figures are drawn (``storage_lock(storage_url, "finish")``);
            default ``lock``.
        end_on_stop: end the runs when the job stops or fails (``on_stop``); False
            when the caller does (``relaxtune.report.background``).
        claims_dir: the folder of the figures' claims (``_share_figures``): the job's
            output folder, which its workers share; default the system's temporary folder.
    """

    def __init__(
        self,
        uri: str | None,
        task,
        pair: str,
        settings: dict,
        problems,
        job_id: str,
        lock=None,
        finish_lock=None,
        end_on_stop: bool = True,
        claims_dir: str | Path | None = None,
    ) -> None:
        super().__init__(uri, task, pair, lock)
        self._finish_lock = finish_lock or self._lock
        self.job_id = job_id
        self._claims = Path(claims_dir or tempfile.gettempdir()) / "mlflow-figures.claims"
        self.study_runs: dict[str, str] = {}
        self.studies: dict[str, str] = {}
        with self._lock():
            self.task_run_id = self._run(
                f"{task.name} tuning",
                None,
                {"relaxtune.kind": "task"},
                {"relaxtune.task_version": str(task.version), "relaxtune.pair": pair},
            )
            if not self.client.get_run(self.task_run_id).inputs.dataset_inputs:
                self._log_dataset(self.task_run_id, problems)
        self.client.log_dict(self.task_run_id, settings, "settings.json")
        if end_on_stop:
            on_stop(self.end)  # a stopped or failed job ends its runs (relaxtune.tune.stopping)

    def end(self, status: str) -> None:
        """End this job's study runs and task run as ``status`` (``KILLED``: the job was
        stopped; ``FAILED``); a resumed job finds them again and sets them RUNNING."""
        for run_id in [*self.study_runs.values(), self.task_run_id]:
            self.client.set_terminated(run_id, status=status)

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

    # ------------------------------------------------------------------ studies

    def log_costs(self, profile) -> None:
        """The job's cost profile on the task run: an artifact (a serving profile's: every
        batch size), c_rel (at the declared batch size) and the worst spread, a flag tag
        (``relaxtune.cost_flags``)."""
        client, run = self.client, self.task_run_id
        client.log_metric(run, "c_rel", c_rel_of(profile))
        if isinstance(profile, CostProfile | ServingProfile):
            client.log_dict(run, profile.to_dict(), "cost_profile.json")
            spread = cost_spread(profile)
            if spread is not None:
                client.log_metric(run, "cost_spread_max", spread)
            with self._lock():  # every worker sets it at its start (concurrent inserts of one tag clash)
                client.set_tag(run, "relaxtune.cost_flags", " | ".join(profile.flags)[:5000] or "none")

    def start_study(self, method: str, study) -> str:
        """The study's run (created or resumed); returns its id."""
        key = {"relaxtune.kind": "study", "relaxtune.study": study.study_name}
        run_id = self._run(f"{method} study", self.task_run_id, key, {"relaxtune.method": method})
        self.study_runs[method], self.studies[method] = run_id, study.study_name
        spec = get_method(method)
        self._log_params(
            run_id,
            {
                "method": method,
                "knob_name": spec.knob or "-",
                "study_name": study.study_name,
                "task_version": str(self.task.version),
                "pair": self.pair,
            },
        )
        return run_id

    def log_trial(
        self, method: str, number: int, params: dict, metrics: dict, state: str, result, note: str | None = None
    ) -> None:
        """The nested run of trial ``number`` (found by study, number and job; named by
        its point, e.g. ``cactus delta=0.25 N=4``); metrics also on the study run at
        ``step = number``; ``note`` (e.g. why it failed) as a tag."""
        from mlflow.entities import Metric, Param, RunTag

        parent = self.study_runs[method]
        key = {"relaxtune.kind": "trial", "relaxtune.study": self.studies[method], "relaxtune.trial": str(number)}
        name = point_label(method, get_method(method).knob, params.get("knob"), params["n_draft"], params)
        run_id = self._run(name, parent, key)
        wanted = {
            "method": method,
            "knob": params.get("knob", "-"),
            "n_draft": params["n_draft"],
            "trial": number,
            "task_version": self.task.version,
        }
        tags = {"relaxtune.state": state} | ({"relaxtune.note": note[:5000]} if note else {})
        now = int(time.time() * 1000)
        values = [Metric(k, float(v), now, number) for k, v in metrics.items() if isinstance(v, (int, float))]
        with self._lock():  # another worker's backfill may log this trial at the same moment (params, tags: a clash)
            logged = self.client.get_run(run_id).data.params
            params = [Param(k, str(v)) for k, v in wanted.items() if k not in logged]
            # one request per run (a shared tracking server sees one call, not one per metric)
            self.client.log_batch(run_id, metrics=values, params=params, tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.log_batch(parent, metrics=values)
        if result is not None and result.records:
            rows = [{k: r.get(k) for k in SAMPLE_COLUMNS} for r in result.records]
            self._log_table(run_id, rows, "samples.json")
        self.client.set_terminated(
            run_id, status="FINISHED" if state == "COMPLETE" else "KILLED" if state == "PRUNED" else "FAILED"
        )

    def log_confirmation(self, method: str, confirmation) -> None:
        """A method's confirmation on its study run: every attempt as ``confirmation.json``,
        the search and confirmation bounds of the last attempt as metrics (``search_drop_ucb``,
        ``confirm_drop_ucb`` at ``confirm_confidence``) and the outcome as a tag."""
        with self._lock():  # workers confirming together set the same tags (MLflow: insert, then a unique clash)
            run_id = self.study_runs[method]
            attempts = [a.summary() for a in confirmation.attempts]
            self.client.log_dict(
                run_id,
                {
                    "confidence": confirmation.confidence,
                    "planned": confirmation.planned,
                    "attempts": attempts,
                    "missing": confirmation.missing,
                },
                "confirmation.json",
            )
            if attempts:
                last = attempts[-1]
                for key, value in {
                    "search_drop_ucb": last["search_drop_upper_bound"],
                    "confirm_drop_ucb": last["drop_upper_bound"],
                    "confirm_confidence": last["confidence"],
                    "confirm_accuracy": last["accuracy"],
                    "confirm_strict_accuracy": last["strict_accuracy"],
                    "confirm_n": last["n"],
                    "confirm_attempts": len(attempts),
                }.items():
                    self.client.log_metric(run_id, key, float(value))
            done = confirmation.confirmed
            self.client.set_tag(
                run_id,
                "relaxtune.confirmed",
                f"trial {done.trial} (attempt {done.attempt})" if done else "none (failed or not run)",
            )

    def finish(self, result, config, config_path: Path) -> None:
        """Close the job's runs (``result``: the finished job, ``Tuner.result``) once strict is known at every N and
        the config is
        built: each study's figures, table, chosen point and description; the task
        run's decision, figures, points and config. Done once per config: a worker of the
        same job that finds the task run already finished with the same config (tag
        ``relaxtune.finished_config``, under the finish lock) draws nothing again.
        Workers finishing together split the figures first (``_share_figures``); the
        tracker's lock is taken only around the reads and run writes, so other
        workers' log calls never wait for the drawing."""
        import hashlib
        import json

        digest = hashlib.sha256(
            json.dumps(
                {k: v for k, v in config.model_dump(mode="json").items() if k != "created"}, sort_keys=True, default=str
            ).encode()
        ).hexdigest()[:16]
        outcomes = result.outcomes
        per_method, baselines = self._points(result, config), baseline_points(result)
        jobs = self._figure_jobs(self.task_run_id, per_method, baselines, config, self.study_runs)
        self._share_figures(jobs, digest, wait=False)  # the figures nobody draws yet, before queuing for the lock
        with self._finish_lock():
            with self._lock():
                self._backfill(outcomes)
            if self.client.get_run(self.task_run_id).data.tags.get("relaxtune.finished_config") == digest:
                for o in outcomes:  # reopened by this worker's start: closed again, nothing redrawn
                    self.client.set_terminated(self.study_runs[o.method])
                self.client.set_terminated(self.task_run_id)
                return
            for o in outcomes:
                self._finish_study(o, per_method[o.method], baselines, config.methods[o.method], config.epsilon)
            self._log_decision(
                self.task_run_id,
                self.task.name,
                per_method,
                baselines,
                config,
                config_path,
                self.study_runs,
                lambda jobs: self._share_figures(jobs, digest, wait=True),
            )
            for o in outcomes:
                self.client.set_terminated(self.study_runs[o.method])
            self.client.set_terminated(self.task_run_id)
            self.client.set_tag(self.task_run_id, "relaxtune.finished_config", digest)

    def _share_figures(self, jobs, digest: str, wait: bool) -> None:
        """Draw and log each figure of ``jobs`` (``_figure_jobs``) not yet drawn for the
        config ``digest`` (tag ``relaxtune.figures`` on the task run: figure -> digest),
        each under a claim of its own (``relaxtune.tune.claims``, in the job's output
        folder), so workers finishing together split the figures. Without ``wait`` a
        figure another worker is drawing is left to it; with ``wait``, its claim is
        waited for and a figure still missing is drawn (its worker died drawing it)."""
        import hashlib
        import json

        from ..tune.claims import claim

        for key, draw, places in jobs:
            path = self._claims / (hashlib.sha256(f"{self.job_id}\n{key}".encode()).hexdigest()[:24] + ".lock")
            with claim(path, wait=wait) as mine:
                if not mine or json.loads(self._tag("relaxtune.figures", "{}")).get(key) == digest:
                    continue
                self._log_figure(draw, places)
                with self._lock():  # read-modify-write of one tag that every worker writes
                    drawn = json.loads(self._tag("relaxtune.figures", "{}")) | {key: digest}
                    self.client.set_tag(self.task_run_id, "relaxtune.figures", json.dumps(drawn, sort_keys=True))

    def _tag(self, name: str, default: str) -> str:
        """A tag of the task run as it is now in the store."""
        return self.client.get_run(self.task_run_id).data.tags.get(name, default)

    def _backfill(self, outcomes) -> None:
        """Log the ended trials that have no run: their worker died between telling the
        study and logging the run (one run per trial, whoever logs it)."""
        from ..tune.records import point_values  # the stored metrics, v2 or v3, as judged

        for o in outcomes:
            key = {"relaxtune.kind": "trial", "relaxtune.study": o.study.study_name, "relaxtune.job": self.job_id}
            logged = {r.data.tags.get("relaxtune.trial") for r in self._find(key)}
            for t in o.study.get_trials(deepcopy=False):
                if (
                    t.state.name in ("COMPLETE", "PRUNED", "FAIL")
                    and str(t.number) not in logged
                    and "n_draft" in t.params
                ):
                    note = t.user_attrs.get("pruned") or t.user_attrs.get("error")
                    self.log_trial(
                        o.method,
                        t.number,
                        t.params,
                        point_values(t.user_attrs.get("metrics")),
                        t.state.name,
                        None,
                        note=note,
                    )

    def _finish_study(self, outcome, points: list[Point], baselines: list[Point], result, epsilon: float) -> None:
        """A study's table, chosen point, name and description (its figures come with
        the task run's, drawn once for both)."""
        from mlflow.entities import Metric, RunTag

        run_id = self.study_runs[outcome.method]
        self._log_table(run_id, points_table(points + baselines), "pareto_front.json")
        name, description = study_summary(result, epsilon)
        chosen = (result.trial if result.trial is not None else outcome.chosen.number) if result.feasible else None
        tags = {
            "relaxtune.chosen_trial": str(chosen) if chosen is not None else "none (use strict)",
            "mlflow.runName": name,
            "mlflow.note.content": description,
        }
        now = int(time.time() * 1000)
        metrics = {"tokens_spent": float(outcome.tokens)}
        if result.feasible:
            metrics |= {
                "chosen_speedup": result.modeled_speedup,
                "chosen_drop_ucb": result.drop_upper_bound,
                "chosen_accuracy": result.accuracy,
            }
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
