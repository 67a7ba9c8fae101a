"""The transfer matrix on the synthetic evaluation, where the truth is known: task
"safe" loses nothing at any delta, task "fragile" loses every second problem
above delta = 1. Each tunes cactus (the paper's grid at N = 4): safe confirms
delta = 10, fragile (searched on half its problems, confirmed on the other
half) delta = 1; delta = 10 is then safe on safe and unsafe on fragile."""

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from relaxtune.certify.stats import drop_bound
from relaxtune.job.run import run_tune_job
from relaxtune.report.export import load_config, save_config
from relaxtune.tasks.spec import load_problems, load_task
from relaxtune.transfer.figure import OVER, WITHIN, matrix_figure
from relaxtune.transfer.run import Cell, TransferError, TransferMatrix, run_transfer
from relaxtune.tune.confirm import confirmation_seed, holdout_split
from relaxtune.tune.settings import TuneSettings

from .synthetic import Synthetic, SyntheticPair, write_task

PROBLEMS = 40


class PerTask:
    """``evaluate`` stand-in: each task its own ``Synthetic`` truth, every new sample recorded on disk."""

    def __init__(self, fail_above: dict[str, float] | None = None):
        fail = fail_above or {}
        self.by_task = {
            "safe": Synthetic(cliff=100.0, delay=1e-4, fail_above=fail.get("safe")),
            "fragile": Synthetic(cliff=1.0, delay=1e-4, fail_above=fail.get("fragile")),
        }

    def __call__(self, spec, backend, config, **kw):
        return self.by_task[spec.name](spec, backend, config, **kw)

    @property
    def generated(self) -> list[tuple[str, str, str]]:
        return [g for s in self.by_task.values() for g in s.generated]


@pytest.fixture(scope="module")
def tuned_dir(tmp_path_factory) -> Path:
    """Both tasks tuned into one output folder (copied by ``tuned``, so each test starts from it)."""
    root = tmp_path_factory.mktemp("tuned")
    fn = PerTask()
    for name, epsilon, confirm in (("safe", 0.15, "seeds"), ("fragile", 0.2, "holdout")):
        task = write_task(root / "evals", PROBLEMS, name)
        settings = TuneSettings(
            task=task,
            methods=["cactus"],
            n_drafts=[4],
            trials=4,
            stage_size=10,
            c_rel=0.2,
            epsilon=epsilon,
            confirm=confirm,
            output_dir=str(root / "runs"),
        )
        run_tune_job(settings, SyntheticPair(), progress=False, evaluate_fn=fn, track=False, log=lambda message: None)
    return root


@pytest.fixture
def tuned(tuned_dir, tmp_path):
    """``(task paths, output folder, MLflow URI)`` of a fresh copy of the tuned tasks; one
    MLflow store for the module (creating one takes seconds)."""
    shutil.copytree(tuned_dir, tmp_path / "t", ignore=shutil.ignore_patterns("mlflow.db*"))
    root = tmp_path / "t"
    for name in ("safe", "fragile"):  # the task files name their data by absolute path
        spec = root / "evals" / f"{name}.yaml"
        spec.write_text(spec.read_text().replace(str(tuned_dir), str(root)))
    tasks = [str(root / "evals" / f"{name}.yaml") for name in ("safe", "fragile")]
    return tasks, str(root / "runs"), f"sqlite:///{tuned_dir / 'mlflow.db'}"


def transfer(tuned, fn=None, **kw):
    tasks, output_dir, uri = tuned
    return run_transfer(
        kw.pop("tasks", tasks),
        output_dir=output_dir,
        mlflow_uri=uri,
        backend=SyntheticPair(),
        evaluate_fn=fn or PerTask(),
        progress=False,
        log=lambda message: None,
        **kw,
    )


def test_a_setting_safe_on_its_task_is_flagged_on_a_task_it_breaks(tuned):
    fn = PerTask()
    matrix, written = transfer(tuned, fn)
    assert matrix.tasks == ["safe", "fragile"] and matrix.methods == ["cactus"] and len(matrix.cells) == 4
    level = 1 - 0.1 / 4  # the 0.9 of the configs, split over four cells
    assert matrix.confidence == 0.9 and matrix.confidence_each == pytest.approx(level)
    cell = {(c.source, c.target): c for c in matrix.cells}
    assert {k: (c.knob, c.within) for k, c in cell.items()} == {
        ("safe", "safe"): (10.0, True),
        ("safe", "fragile"): (10.0, False),
        ("fragile", "safe"): (1.0, True),
        ("fragile", "fragile"): (1.0, True),
    }
    search, held = holdout_split(load_problems(load_task(tuned[0][1]), PROBLEMS), 0)
    # the diagonal: each task's own point on its confirmation samples (fresh seeds; fragile's held-out half)
    assert (cell["safe", "safe"].samples, cell["safe", "safe"].seed, cell["safe", "safe"].problems) == (
        "confirmation",
        confirmation_seed(0, 1),
        PROBLEMS,
    )
    assert (cell["fragile", "fragile"].seed, cell["fragile", "fragile"].problems) == (confirmation_seed(0, 1), 20)
    for key, n in ((("safe", "safe"), PROBLEMS), (("fragile", "fragile"), 20), (("fragile", "safe"), PROBLEMS)):
        assert cell[key].metrics["drop"] == 0 and cell[key].metrics["n"] == n
        assert cell[key].metrics["drop_ucb"] == drop_bound([(1, 0, 0)] * n, level).upper  # at the split level
    # off the diagonal: the target's search samples (fragile's search half, base seed 0)
    broken = cell["safe", "fragile"]
    wrong = sum(int(p.id) % 2 == 0 for p in search)  # delta = 10 gets every even-numbered problem wrong there
    assert (broken.samples, broken.seed, broken.problems, broken.metrics["n"]) == ("search", 0, 20, 20)
    assert broken.metrics["drop"] == pytest.approx(wrong / 20) and wrong >= 5
    assert broken.metrics["drop_ucb"] == pytest.approx(
        drop_bound([(1, 1, 0)] * wrong + [(1, 0, 0)] * (20 - wrong), level).upper
    )
    assert broken.metrics["drop_ucb"] > broken.epsilon == 0.2
    assert [c.epsilon for c in matrix.cells] == [0.15, 0.2, 0.15, 0.2]  # each target's own budget
    own = load_config(Path(tuned[1]) / "safe.tuned.yaml").methods["cactus"]  # the diagonal replays the confirmation
    assert (own.n, own.accuracy, own.modeled_speedup) == tuple(
        cell["safe", "safe"].metrics[k] for k in ("n", "accuracy", "speedup")
    )
    assert len(written) == 2


def test_records_are_reused_and_nothing_is_generated_twice(tuned):
    """Fragile's search pruned delta = 10 after its first stage (10 of its 20 search
    problems): the transfer generates only the other 10. Strict, the diagonal and
    delta = 1 on safe (a grid point safe's search ran) are read back. Run again,
    the transfer generates nothing and judges every cell the same."""
    fn = PerTask()
    first, _ = transfer(tuned, fn)
    assert len(fn.generated) == 10 and {(t, label) for t, label, _ in fn.generated} == {
        ("fragile", "cactus-10__N4__seed0")
    }
    assert len({pid for _, _, pid in fn.generated}) == 10
    again = PerTask()
    second, _ = transfer(tuned, again)
    assert again.generated == []
    assert [c.row() for c in second.cells] == [c.row() for c in first.cells]


def test_the_tuned_configs_gain_a_transfer_section_that_round_trips(tuned, tmp_path):
    tasks, output_dir, _ = tuned
    before = {n: load_config(Path(output_dir) / f"{n}.tuned.yaml") for n in ("safe", "fragile")}
    matrix, written = transfer(tuned)
    assert sorted(p.name for p in written) == ["fragile.tuned.yaml", "safe.tuned.yaml"]
    fragile, safe = (load_config(Path(output_dir) / f"{n}.tuned.yaml") for n in ("fragile", "safe"))
    assert fragile.model_copy(update={"transfer": None}) == before["fragile"]  # nothing else changed
    part = fragile.transfer
    assert part.tasks == ["safe", "fragile"] and part.cells == 4 and part.confidence_each == pytest.approx(0.975)
    assert "Bonferroni" in part.rule and set(part.sources) == {"safe", "fragile"} and set(part.targets) == {"safe"}
    theirs, mine = part.sources["safe"]["cactus"], part.sources["fragile"]["cactus"]
    assert (theirs.knob, theirs.within_epsilon, theirs.n, theirs.samples, theirs.epsilon) == (
        10.0,
        False,
        20,
        "search",
        0.2,
    )
    assert theirs.drop_upper_bound == pytest.approx(matrix.cell("cactus", "safe", "fragile").metrics["drop_ucb"])
    assert (mine.knob, mine.within_epsilon, mine.samples, mine.n) == (1.0, True, "confirmation", 20)
    assert part.targets["safe"]["cactus"].within_epsilon and part.targets["safe"]["cactus"].epsilon == 0.15
    assert safe.transfer.targets["fragile"]["cactus"].within_epsilon is False  # safe's own setting breaks fragile
    assert part.mlflow["experiment"] == "relaxtune-fragile" and part.mlflow["cross_experiment"] == "relaxtune-transfer"
    assert load_config(save_config(fragile, tmp_path / "copy.yaml")) == fragile


def test_the_figure_and_table_are_logged_in_each_task_and_across_tasks(tuned, tmp_path):
    transfer(tuned)
    transfer(tuned)  # again: the same runs, the table replaced
    client = MlflowClient(tuned[2])
    for experiment in ("relaxtune-safe", "relaxtune-fragile", "relaxtune-transfer"):
        exp = client.get_experiment_by_name(experiment)
        (run,) = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("relaxtune.kind") == "transfer"]
        assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
            "transfer_matrix.png",
            "transfer_matrix.json",
        }
        table = json.loads(
            Path(
                client.download_artifacts(run.info.run_id, "transfer_matrix.json", str(tmp_path / experiment))
            ).read_text()
        )
        rows = [dict(zip(table["columns"], r)) for r in table["data"]]
        assert [(r["source"], r["target"], r["within_epsilon"]) for r in rows] == [
            ("safe", "safe", True),
            ("safe", "fragile", False),
            ("fragile", "safe", True),
            ("fragile", "fragile", True),
        ]
        assert run.data.params["cells"] == "4" and run.data.params["tasks"] == "safe,fragile"
    fragile = client.get_experiment_by_name("relaxtune-fragile")
    (run,) = [r for r in client.search_runs([fragile.experiment_id]) if r.data.tags.get("relaxtune.kind") == "transfer"]
    assert run.data.metrics["cactus/safe/within"] == 0.0 and run.data.metrics["cactus/fragile/within"] == 1.0
    assert "cactus/safe/safe/within" not in run.data.metrics  # a task's run holds the cells judged on it


def test_bad_requests_are_refused_with_the_way_out(tuned, tmp_path):
    tasks, output_dir, _ = tuned
    with pytest.raises(TransferError, match="at least two tasks"):
        transfer(tuned, tasks=tasks[:1])
    with pytest.raises(TransferError, match="given twice"):
        transfer(tuned, tasks=[tasks[0], tasks[0]])
    with pytest.raises(TransferError, match="no task has a confirmed point for mentored"):
        transfer(tuned, methods=["mentored"])
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        transfer(tuned, methods=["nope"])
    other = write_task(tmp_path / "other", 10, "untuned")
    with pytest.raises(TransferError, match=r"no tuned config for untuned .*run `relaxtune tune --task"):
        transfer(tuned, tasks=[tasks[0], other])
    spec = Path(tasks[0])
    spec.write_text(spec.read_text().replace("version: 1", "version: 2"))
    with pytest.raises(TransferError, match="tuned for safe v1, the task is now v2"):
        transfer(tuned)
    spec.write_text(spec.read_text().replace("version: 2", "version: 1"))
    path = Path(output_dir) / "fragile.tuned.yaml"
    config = load_config(path)
    save_config(config.model_copy(update={"verifier": "another-verifier"}), path)
    with pytest.raises(TransferError, match="different model pairs"):
        transfer(tuned)


def test_the_target_judges_with_its_own_guards_and_a_failed_cell_is_kept(tuned):
    """A rambling guard of the target's tuning run (safe: length ratio <= 0.5, which
    every point breaks) holds every cell judged on safe out of epsilon, the diagonal
    included; an evaluation that fails on fragile is an error cell, the others run."""
    tasks, output_dir, _ = tuned
    job = Path(output_dir) / "safe.job.yaml"
    job.write_text(job.read_text() + "max_length_ratio: 0.5\n")
    matrix, _ = transfer(tuned, PerTask(fail_above={"fragile": 5.0}))
    cell = {(c.source, c.target): c for c in matrix.cells}
    assert not cell["safe", "safe"].within and not cell["fragile", "safe"].within
    assert cell["safe", "safe"].metrics["drop_ucb"] < 0.15 and cell["safe", "safe"].metrics["length_ratio"] == 1.0
    assert cell["fragile", "fragile"].within  # fragile's tuning run had no guard
    broken = cell["safe", "fragile"]
    assert broken.error == "RuntimeError: evaluation exploded" and not broken.within and broken.metrics == {}
    exported = load_config(Path(output_dir) / "fragile.tuned.yaml").transfer.sources["safe"]["cactus"]
    assert exported.error == broken.error and exported.within_epsilon is False and exported.drop_upper_bound is None
    with pytest.raises(TransferError, match="every cell failed"):
        transfer(tuned, PerTask(fail_above={"fragile": 0.0, "safe": 0.0}))
    assert load_config(Path(output_dir) / "fragile.tuned.yaml").transfer.sources["safe"]["cactus"] == exported


def _cell(method, source, target, ucb=None, within=False, error=None):
    metrics = {} if ucb is None else {"drop_ucb": ucb, "speedup": 1.5, "n": 30}
    return Cell(method, source, target, 1.0, 4, "search", 0, 30, 0.1, 0.99, metrics, within, error)


def test_the_figure_marks_every_cell_by_its_verdict():
    """Three tasks: c has no confirmed cactus point (its row is grey), a -> b is over
    epsilon (a cross, hatched), b -> c failed (a cross, hatched); the diagonal is outlined."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    cells = [
        _cell("cactus", "a", "a", 0.02, True),
        _cell("cactus", "a", "b", 0.3),
        _cell("cactus", "a", "c", 0.05, True),
        _cell("cactus", "b", "a", 0.09, True),
        _cell("cactus", "b", "b", 0.01, True),
        _cell("cactus", "b", "c", error="RuntimeError: boom"),
    ]
    fig = matrix_figure(TransferMatrix(["a", "b", "c"], ["cactus"], 0.9, 0.9833, cells, "pair", "key"))
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert sum(t.startswith(WITHIN) for t in texts) == 4 and sum(t.startswith(OVER) for t in texts) == 2
    assert f"{OVER} \u22640.300" in texts[1] and texts[5] == f"{OVER} failed" and texts.count("no tuned\npoint") == 3
    patches = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert sum(p.get_hatch() == "///" for p in patches) == 2  # the two crosses
    assert sum(p.get_hatch() is None for p in patches) == 3  # the diagonal's outlines
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a\ndelta=1 N=4", "b\ndelta=1 N=4", "c"]
    plt.close(fig)


def test_a_transferred_point_keeps_every_named_knob_and_its_scope(tuned):
    """The point judged on another task is the whole confirmed point: SGLang's single
    threshold apart from the acc one travels as a further knob (evaluating alpha's view,
    the tied thresholds, would judge another rule), and the relaxation scope with it."""
    from relaxtune.transfer.run import tuned_point

    tasks, output_dir, _ = tuned
    config = load_config(Path(output_dir) / "safe.tuned.yaml")
    cactus = tuned_point(config, "cactus")
    assert (cactus.method, cactus.knob, cactus.n_draft, cactus.extra, cactus.scope) == ("cactus", 10.0, 4, (), "all")
    knobs = {"speculative_accept_threshold_acc": 0.5, "speculative_accept_threshold_single": 0.275}
    config.methods["sglang_threshold"] = config.methods["cactus"].model_copy(
        update={
            "method": "sglang_threshold",
            "knob_name": "threshold",
            "knob": 0.5,
            "knobs": knobs,
            "scope": "thinking",
        }
    )
    point = tuned_point(config, "sglang_threshold")
    assert point.extra == (("speculative_accept_threshold_single", 0.275),) and point.scope == "thinking"
    assert point.point_knob == knobs and point.seed == cactus.seed
    assert "+speculative_accept_threshold_single=0.275" in point.label
