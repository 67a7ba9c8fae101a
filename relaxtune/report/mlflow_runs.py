"""What the MLflow runs of a tuning job and of its exports share
(``relaxtune.report.tracking``): the experiment (created as a model-training one), runs
found by tags, tables and figures that replace their earlier versions, params
that are write-once, and a tuned config's decision logged with its figures."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from ..decoding.methods import get_method
from ..tune.pareto import Point, points_table, study_points
from ..tune.phases import count, phase
from .batch_figure import batch_figure
from .decision import decide
from .figures import combined_figure, knob_figure, method_figure
from .stores import DEFAULT_URI, prepare_mlflow

__all__ = [
    "Runs",
    "DEFAULT_URI",
    "filter_literal",
    "run_url",
    "experiment_id",
    "find_runs",
    "log_table",
    "dataset_entity",
    "batch_table",
]

KIND_TAG, TRAINING = "mlflow.experimentKind", "custom_model_development"


def experiment_id(client, name: str, lock=nullcontext) -> str:
    """The id of experiment ``name``, created as a model-training experiment when
    missing (an older one without a kind gets the tag)."""
    with lock():  # the first client of a new store creates its tables
        exp = client.get_experiment_by_name(name)
        if exp is None:
            return client.create_experiment(name, tags={KIND_TAG: TRAINING})
    if KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, KIND_TAG, TRAINING)
    return exp.experiment_id


def run_url(tracking_uri: str, experiment: str, run_id: str, ui: str = "http://127.0.0.1:5000") -> str:
    """The run's page in the MLflow UI (the model-training view): on the tracking server
    for an ``http(s)`` URI, else on ``ui`` (``mlflow ui``'s default address)."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else ui
    return f"{base}/#/experiments/{experiment}/runs/{run_id}?workflowType=machine_learning"


def find_runs(client, experiment_id: str, tags: dict[str, str]) -> list:
    """Active runs of an experiment carrying every tag in ``tags`` (values compared
    exactly, quotes included: ``filter_literal``), oldest first."""
    clauses = [f"tags.`{k}` = {q}" for k, v in tags.items() if (q := filter_literal(v)) is not None]
    runs = client.search_runs(
        [experiment_id], filter_string=" and ".join(clauses), order_by=["attributes.start_time ASC"]
    )
    return [r for r in runs if all(r.data.tags.get(k) == v for k, v in tags.items())]


def dataset_entity(dataset):
    """The ``mlflow.entities.Dataset`` that ``mlflow.log_input(dataset)`` logs for an
    ``mlflow.data`` dataset (its ``to_dict()``: name, digest, source type, source, schema,
    profile), built with the public API (``MlflowClient.log_inputs`` takes entities)."""
    from mlflow.entities import Dataset

    fields = dataset.to_dict()
    return Dataset(
        name=fields["name"],
        digest=fields["digest"],
        source_type=fields["source_type"],
        source=fields["source"],
        schema=fields.get("schema"),
        profile=fields.get("profile"),
    )


def log_table(client, run_id: str, rows: list[dict], artifact_file: str, lock=nullcontext) -> None:
    """``MlflowClient.log_table``, but replacing the table (log_table appends to an
    existing one); ``lock`` guards the read-modify-write of the run's table tag."""
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


class Runs:
    """What the tuning job's tracker and an export's share: the client, the
    experiment, finding runs by tags, replacing tables and figures, and logging a
    config's decision with its figures."""

    def __init__(self, uri: str | None, task, pair: str, lock=None) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri or DEFAULT_URI
        prepare_mlflow(self.uri, logging.getLogger(__name__).warning)  # created once, whoever comes first
        self.client = MlflowClient(self.uri)
        self.task, self.pair = task, pair
        self._lock = lock or nullcontext
        self.experiment_id = experiment_id(self.client, f"relaxtune-{task.name}", self._lock)

    def _find(self, tags: dict[str, str]):
        """Active runs of the experiment carrying every tag in ``tags``, oldest first."""
        return find_runs(self.client, self.experiment_id, tags)

    def _log_dataset(self, run_id: str, problems) -> None:
        """The problems as the run's dataset input, through the client (``mlflow.log_input``
        needs the run active in this thread, which would clash with a caller's active run)."""
        import mlflow
        import pandas as pd
        from mlflow.entities import DatasetInput, InputTag

        df = pd.DataFrame(
            [
                {"id": p.id, "prompt": p.prompt, "gold": json.dumps(p.gold) if isinstance(p.gold, dict) else p.gold}
                for p in problems
            ]
        )
        dataset = mlflow.data.from_pandas(df, name=f"{self.task.name}-v{self.task.version}")
        context = InputTag("mlflow.data.context", "tuning")  # what mlflow.log_input(context=...) writes
        self.client.log_inputs(run_id, [DatasetInput(dataset_entity(dataset), [context])])

    def _log_table(self, run_id: str, rows: list[dict], artifact_file: str) -> None:
        """``log_table`` under the job's lock (workers finishing the same study at once)."""
        log_table(self.client, run_id, rows, artifact_file, self._lock)

    def _log_figure(self, draw, places: list[tuple[str, str]]) -> None:
        """Draw one figure (``draw()``: a matplotlib figure, or None: nothing to draw) and
        log it to every ``(run_id, artifact path)`` of ``places``, replacing an earlier
        one; the figure is closed."""
        with phase("figures"):
            import matplotlib.pyplot as plt

            fig = draw()
            if fig is None:
                return
            count("figures drawn")
        with tempfile.TemporaryDirectory() as tmp:
            drawn = Path(tmp, "drawn.png")
            with phase("figures"):
                fig.savefig(drawn)  # what MlflowClient.log_figure does
                plt.close(fig)
            for i, (run_id, artifact) in enumerate(places):
                path = Path(tmp, str(i), artifact)
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(drawn, path)
                folder = str(Path(artifact).parent)
                self.client.log_artifact(run_id, str(path), None if folder == "." else folder)

    def _log_params(self, run_id: str, params: dict[str, str]) -> dict[str, tuple[str, str]]:
        """Log the params the run lacks; returns those it holds with another value
        (``key -> (held, wanted)``): params are write-once."""
        from mlflow.entities import Param

        with self._lock():  # workers logging the same run's params at once: the second insert clashes
            held = self.client.get_run(run_id).data.params
            new = [Param(k, v) for k, v in params.items() if k not in held]
            if new:
                self.client.log_batch(run_id, params=new)
        return {k: (held[k], v) for k, v in params.items() if k in held and held[k] != v}

    def _figures(self, method: str, points: list[Point], baselines: list[Point], epsilon: float) -> dict:
        """A method's figures by file name, each as a function that draws it:
        ``pareto_front.png`` and, for a method with a knob, ``speed_vs_<knob>.png``."""
        spec, task = get_method(method), self.task.name
        out = {
            "pareto_front.png": lambda: method_figure(
                points, baselines, epsilon, f"{task}: {method} (epsilon {epsilon:g})"
            )
        }
        if spec.knob:
            title = f"{task}: {method}, modeled speed-up and drop vs {spec.knob}"
            out[f"speed_vs_{spec.knob}.png"] = lambda: knob_figure(
                points, baselines, epsilon, spec.knob, bool(spec.search and spec.search[2]), title
            )
        return out

    def _figure_jobs(
        self,
        run_id: str,
        per_method: dict[str, list[Point]],
        baselines: list[Point],
        config,
        study_runs: dict[str, str] | None = None,
    ) -> list[tuple[str, object, list[tuple[str, str]]]]:
        """Every figure of a config's decision as ``(key, draw, places)``: ``key`` names it
        within the decision, ``draw()`` draws it, ``places`` are the ``(run_id, artifact
        path)`` it goes to: the combined figure and each method's figures
        (``figures/<method>_<name>``) on ``run_id``, a method's also on its run of ``study_runs``."""
        d = decide(config)
        title = (
            f"{self.task.name}: Pareto fronts by method (epsilon {config.epsilon:g})\n"
            f"recommended: {d.label}, modeled {config.recommendation.modeled_speedup:.2f}x"
        )
        jobs = [
            (
                "pareto_fronts_by_method.png",
                lambda: combined_figure(per_method, baselines, config.epsilon, title),
                [(run_id, "pareto_fronts_by_method.png")],
            )
        ]
        batches = config.by_batch_size
        if batches is not None and len(batches.best) > 1:
            title = f"{self.task.name}: modeled speed-up by serving batch size\n{batches.line}"
            jobs.append(
                (
                    "speedup_vs_batch_size.png",
                    lambda: batch_figure(config, title),
                    [(run_id, "speedup_vs_batch_size.png")],
                )
            )
        for method, points in per_method.items():
            for name, draw in self._figures(method, points, baselines, config.epsilon).items():
                places = [(run_id, f"figures/{method}_{name}")] + ([(study_runs[method], name)] if study_runs else [])
                jobs.append((f"{method}_{name}", draw, places))
        return jobs

    def _log_decision(
        self,
        run_id: str,
        name: str,
        per_method: dict[str, list[Point]],
        baselines: list[Point],
        config,
        config_path: Path,
        study_runs: dict[str, str] | None = None,
        figures=None,
    ) -> None:
        """The config's decision (params, metrics, tags, name, description), its figures
        (``_figure_jobs``: drawn one after the other, or by ``figures(jobs)``), every
        point as a table, and the config file."""
        from mlflow.entities import Metric, RunTag

        d = decide(config)
        conflicts = self._log_params(run_id, d.params)
        tags = d.tags | {"mlflow.note.content": d.description, "mlflow.runName": f"{name}: use {d.label}"}
        if conflicts:
            held = ", ".join(f"{k}={old}" for k, (old, _) in conflicts.items())
            tags["relaxtune.params_note"] = (
                f"params are write-once: they hold this run's first decision ({held}); "
                "the tags, metrics and description hold the latest"
            )
        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, 0) for k, v in d.metrics.items()],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )
        jobs = self._figure_jobs(run_id, per_method, baselines, config, study_runs)
        if figures is not None:
            figures(jobs)
        else:
            for _, draw, places in jobs:
                self._log_figure(draw, places)
        self._log_table(run_id, points_table([p for ps in per_method.values() for p in ps] + baselines), "points.json")
        if config.by_batch_size is not None:
            self._log_table(run_id, batch_table(config), "by_batch_size.json")
        self.client.log_artifact(run_id, str(config_path))

    def _points(self, result, config) -> dict[str, list[Point]]:
        """Each method's trial points (``result``: the finished job), judged under the job's
        statistics settings (``result.stats``), its exported point marked."""
        return {
            o.method: study_points(
                o.method, get_method(o.method).knob, o.study, config.methods.get(o.method), result.stats
            )
            for o in result.outcomes
        }


def batch_table(config) -> list[dict]:
    """A config's ``by_batch_size`` as table rows, one per batch size: ``batch_size``,
    ``declared`` (the recommendation's), the best point (``method``, ``knob``, ``n_draft``),
    its ``modeled_speedup`` over batched AR there, ``decoding`` (plain: below 1), every
    candidate's speed-up there (``speedup <label>``) and ``stops_paying`` (at or above
    ``stops_paying_at``)."""
    batches = config.by_batch_size
    stops = batches.stops_paying_at
    return [
        {
            "batch_size": b,
            "declared": b == config.recommendation.batch_size,
            "method": best.method,
            "knob": best.knob,
            "n_draft": best.n_draft,
            "modeled_speedup": best.modeled_speedup,
            "decoding": best.decoding,
            "stops_paying": stops is not None and b >= stops,
        }
        | {f"speedup {label}": speeds.get(b) for label, speeds in batches.speedups.items()}
        for b, best in sorted(batches.best.items())
    ]


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
