"""The speed a deployment sees at its serving batch size (issue 37, the export side): the
tuned config's best confirmed point per batch size and where speculation stops paying, the
recommendation for the declared batch size or a weighting, ``relaxtune export
--cost-profile`` re-pricing a finished job, the summary's lines and the MLflow table and
figure (the synthetic evaluation, real Optuna and MLflow on sqlite, no models).

The serving profile is built so the crossover is known: every batch size has t_AR 1 s and
t_draft 0.1 s, and verifying N + 1 = 5 tokens costs 1, 2 and 5 steps at batch sizes 1, 8
and 32 (the forward turns compute bound as B grows). The synthetic cactus point at delta 10
accepts 3.6 drafts per round at N = 4, strict 0.8, with equal lengths, so at B the speed-ups
are 4.6 / (0.4 + v_B) and 1.8 / (0.4 + v_B): cactus 3.286, 1.917, 0.852 and strict 1.286,
0.75, 0.333. Speculation stops paying from batch 32.
"""

import json
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from relaxtune.cli import app
from relaxtune.cli.tune import _summary
from relaxtune.decoding.serving import ServingProfile
from relaxtune.decoding.speed import CostProfile
from relaxtune.job.run import run_tune_job
from relaxtune.report.batch_figure import batch_figure
from relaxtune.report.export import build_config, load_config, save_config
from relaxtune.report.reexport import JobError, read_cost_profile
from relaxtune.report.tracking import Tracker
from relaxtune.tune.batches import Prices, by_batch, paying_line, strict_speedup
from relaxtune.tune.confirm import confirm
from relaxtune.tune.recommend import cost_spread
from relaxtune.tune.tuning import Tuner, TuneSettings, choose

from .synthetic import PROBLEMS, SPEC, Synthetic, SyntheticPair, write_task

VERIFY = {1: 1.0, 8: 2.0, 32: 5.0}  # verify(5) in AR steps, by batch size
CACTUS = {1: 4.6 / 1.4, 8: 4.6 / 2.4, 32: 4.6 / 5.4}
STRICT = {1: 1.8 / 1.4, 8: 1.8 / 2.4, 32: 1.8 / 5.4}


def serving(weights: dict[int, float] | None = None) -> ServingProfile:
    profiles = {
        b: CostProfile(1.0, 0.1, {5: v}, source=f"test host, batch {b}", batch_size=b) for b, v in VERIFY.items()
    }
    return ServingProfile(profiles, weights or {})


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def tuned(folder: Path, profile, tracker=None):
    """A finished synthetic job on 40 problems (cactus at N=4, confirmed on fresh seeds)
    priced with ``profile``: its result and config."""
    s = TuneSettings(
        task="synthetic",
        methods=["cactus"],
        n_drafts=[4],
        trials=4,
        stage_size=40,
        c_rel=0.2,
        output_dir=str(folder),
        epsilon=0.2,
        confirm="seeds",
    )
    evaluate = Synthetic(cliff=20.0, drop=0.25)
    tuner = Tuner(s, SPEC, PROBLEMS[:40], SyntheticPair(), profile, tracker, evaluate_fn=evaluate, progress=False)
    outcome = tuner.tune_method("cactus")
    tuner.baseline(4)
    outcome.chosen = choose(outcome.study, s, tuner.strict_points())
    result = tuner.result([outcome], confirm(tuner, [outcome], PROBLEMS[:40]))
    return result, build_config(result)


@pytest.fixture(scope="module")
def at_1(tmp_path_factory, uri):
    """Declared batch size 1 (the default weight), tracked in MLflow."""
    folder = tmp_path_factory.mktemp("b1")
    tracker = Tracker(
        uri, SPEC, SyntheticPair.name, {"output_dir": str(folder)}, PROBLEMS[:40], "job-b1", claims_dir=folder
    )
    tracker.log_costs(serving())
    result, config = tuned(folder, serving(), tracker)
    path = save_config(config, folder / "synthetic.tuned.yaml")
    tracker.finish(result, config, path)
    return result, config, tracker


@pytest.fixture(scope="module")
def at_32(tmp_path_factory):
    return tuned(tmp_path_factory.mktemp("b32"), serving({32: 1.0}))


EXPECTED_BEST = {
    b: {
        "method": "cactus",
        "knob": 10.0,
        "knobs": {"delta": 10.0},
        "n_draft": 4,
        "modeled_speedup": pytest.approx(CACTUS[b], rel=1e-12),
        "decoding": "plain" if b == 32 else "speculative",
    }
    for b in VERIFY
}


def test_the_best_point_per_batch_size_and_the_crossover(at_1, at_32, tmp_path):
    for _, config in (at_1[:2], at_32):
        batches = config.by_batch_size
        assert config.serving_batch_sizes == [1, 8, 32]
        assert batches.model_dump()["best"] == EXPECTED_BEST
        assert batches.speedups["strict N=4"] == pytest.approx(STRICT, rel=1e-12)
        assert batches.speedups["cactus"] == pytest.approx(CACTUS, rel=1e-12)
        assert batches.stops_paying_at == 32
        assert batches.line == "speculative decoding stops paying from batch 32 on this host"
        assert load_config(save_config(config, tmp_path / "t.yaml")) == config  # the section round-trips (schema v3)


def test_the_recommendation_follows_the_declared_batch_size(at_1, at_32):
    rec = at_1[1].recommendation
    assert (rec.method, rec.knob, rec.n_draft, rec.batch_size, rec.decoding) == ("cactus", 10.0, 4, 1, "speculative")
    assert rec.weights is None  # modeled at batch size 1 alone
    assert rec.modeled_speedup == pytest.approx(CACTUS[1], rel=1e-12)
    assert rec.strict_modeled_speedup == pytest.approx(STRICT[1], rel=1e-12)
    assert at_1[1].c_rel == 0.1 and at_1[1].cost_profile["weights"] == {"1": 1.0}

    rec = at_32[1].recommendation  # at 32 nothing pays: plain decoding, the reason names the batch size
    assert (rec.batch_size, rec.decoding, rec.method, rec.n_draft, rec.modeled_speedup) == (
        32,
        "plain",
        "plain",
        None,
        1,
    )
    fast = rec.fastest_speculative  # the point plain decoding beats, for information
    assert (fast.method, fast.knob, fast.n_draft) == ("cactus", 10.0, 4)
    assert fast.modeled_speedup == pytest.approx(CACTUS[32], rel=1e-12)
    assert fast.reason.startswith("fastest confirmed point")
    assert rec.reason == (
        "serve the verifier alone (plain decoding): no speculative point pays on the measured costs at serving "
        "batch size 32 (strict's best models 0.33x, every confirmed relaxed point below 1x too)"
    )
    assert {b["decoding"] for b in rec.deploy.values()} == {"plain"}
    assert at_32[1].cost_profile["weights"] == {"32": 1.0}


def test_a_weighting_prices_the_recommendation_at_its_weighted_mean(at_1):
    """Half batch 1, half batch 32: cactus models (3.286 + 0.852) / 2 = 2.069, so it is
    deployed (the declared batch size of a tie is the smallest)."""
    result, _, _ = at_1
    weighted = serving({1: 0.5, 32: 0.5})
    job = replace(
        result, profile=weighted, strict_speedups={4: strict_speedup(weighted, result.baselines[4].l_accept, 4)}
    )
    rec = build_config(job).recommendation
    assert (rec.method, rec.batch_size, rec.decoding) == ("cactus", 1, "speculative")
    assert rec.weights == {"1": 0.5, "32": 0.5}  # the speed-up is their weighted mean, not batch 1's (fresh-venv trial)
    assert rec.modeled_speedup == pytest.approx((CACTUS[1] + CACTUS[32]) / 2, rel=1e-12)
    assert Prices.of(weighted).objective() == "the weighting 1: 0.5, 32: 0.5 of serving batch sizes"


def test_the_summary_of_a_weighting_labels_the_weights_not_a_declared_size(at_1, tmp_path, capsys):
    """A weighting declares no batch size: its rows say each weight (the table said '1 (declared)')."""
    result, _, _ = at_1
    weighted = serving({1: 0.5, 32: 0.5})
    job = replace(
        result, profile=weighted, strict_speedups={4: strict_speedup(weighted, result.baselines[4].l_accept, 4)}
    )
    _summary(build_config(job), tmp_path / "t.yaml")
    out = capsys.readouterr().out
    table = out.split("best confirmed point by serving batch size")[1].split("speculative decoding stops")[0]
    labels = [line.replace("│", " ").split()[0:3] for line in table.splitlines() if "cactus" in line]
    assert labels == [["1", "(weight", "0.5)"], ["8", "cactus", "delta=10"], ["32", "(weight", "0.5)"]]
    assert "declared" not in table


def test_the_summary_says_the_promise_only_when_a_point_was_exported(at_1, tmp_path, capsys):
    """The promise is about every exported point's drop: with none exported it promised nothing (fresh-venv trial)."""
    config = at_1[1]
    _summary(config, tmp_path / "t.yaml")
    assert "promise: " in capsys.readouterr().out
    none = config.model_copy(
        update={"methods": {m: r.model_copy(update={"feasible": False}) for m, r in config.methods.items()}}
    )
    _summary(none, tmp_path / "t.yaml")
    assert "promise: " not in capsys.readouterr().out


def test_prices_read_a_serving_profile_a_single_profile_and_a_fixed_c_rel():
    single = CostProfile(1.0, 0.25, {5: 2.0}, spread={"t_ar": 0.03}, batch_size=4)
    assert Prices.of(single).by_batch == {4: single} and Prices.of(single).declared == 4
    fixed = Prices.of(0.0)  # a free drafter: (l + 1) / 1
    assert (
        fixed.by_batch == {1: 0.0}
        and fixed.speedups(2.0, 4) == {1: 3.0}
        and fixed.objective() == "serving batch size 1"
    )
    assert Prices.of(0.2).speedups(2.0, 4, 1.0, 2.0) == {1: pytest.approx(3.0 / 1.8 / 2.0, rel=1e-12)}
    assert Prices.of(serving({8: 2.0, 32: 1.0})).declared == 8
    noisy = ServingProfile(
        {
            1: CostProfile(1.0, 0.1, spread={"t_ar": 0.02}),
            32: CostProfile(1.0, 0.1, spread={"t_draft": 0.3}, batch_size=32),
        }
    )
    assert cost_spread(noisy) == 0.02 and cost_spread(noisy.reweighted({1: 1.0, 32: 1.0})) == 0.3  # the objective's


def test_stops_paying_lines_and_ties():
    assert (
        paying_line(None, [1, 8, 32, 128])
        == "speculative decoding pays up to batch 128 on this host (the largest profiled)"
    )
    assert paying_line(1, [1, 4, 16]) == (
        "speculative decoding stops paying from batch 1 on this host (it pays at no profiled batch size)"
    )

    class Point:  # a MethodResult's fields the candidates read
        feasible, method, knob, knobs, n_draft, l_accept, length_ratio = (
            True,
            "cactus",
            1.0,
            {"delta": 1.0},
            4,
            0.8,
            1.0,
        )

    out = by_batch({4: {"l_accept": 0.8}}, {"cactus": Point()}, Prices.of(serving()))
    assert {b: v["method"] for b, v in out["best"].items()} == {1: "strict", 8: "strict", 32: "strict"}  # a tie: strict
    with pytest.raises(ValueError, match="no strict baseline and no confirmed point"):
        by_batch({}, {}, Prices.of(0.2))


def test_the_summary_shows_the_table_and_where_speculation_stops_paying(at_1, at_32, tmp_path, capsys):
    _summary(at_1[1], tmp_path / "t.yaml")
    out = capsys.readouterr().out
    table = out.split("best confirmed point by serving batch size")[1].split("speculative decoding stops")[0]
    rows = [" ".join(line.replace("│", " ").split()) for line in table.splitlines() if "cactus" in line]
    assert rows == [
        "1 (declared) cactus delta=10 N=4 3.29 speculative",
        "8 cactus delta=10 N=4 1.92 speculative",
        "32 cactus delta=10 N=4 0.85 plain (verifier alone)",
    ]
    flat = " ".join(out.split())
    assert "speculative decoding stops paying from batch 32 on this host" in flat
    assert "recommendation: cactus delta=10 N=4, modeled 3.29x: fastest confirmed point" in flat

    _summary(at_32[1], tmp_path / "t.yaml")
    flat = " ".join(capsys.readouterr().out.split())
    assert "32 (declared) cactus delta=10 N=4 0.85 plain (verifier alone)" in flat.replace("│", "").replace("  ", " ")
    assert "recommendation: serve the verifier alone (plain decoding): no speculative point pays" in flat
    assert "slower than plain decoding on these costs at serving batch size 32 (c_rel 0.100)" in flat


def test_the_task_run_logs_the_table_and_the_figure(at_1, tmp_path):
    _, config, tracker = at_1
    client = MlflowClient(tracker.uri)
    run = client.get_run(tracker.task_run_id)
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"by_batch_size.json", "speedup_vs_batch_size.png", "pareto_fronts_by_method.png"} <= files
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, "by_batch_size.json", str(tmp_path))).read_text()
    )
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [
        (r["batch_size"], r["declared"], r["method"], r["n_draft"], r["decoding"], r["stops_paying"]) for r in rows
    ] == [
        (1, True, "cactus", 4, "speculative", False),
        (8, False, "cactus", 4, "speculative", False),
        (32, False, "cactus", 4, "plain", True),
    ]
    # MLflow's table format (pandas to_json) keeps 10 decimals
    assert [r["modeled_speedup"] for r in rows] == pytest.approx([CACTUS[1], CACTUS[8], CACTUS[32]], abs=1e-10)
    assert [r["speedup strict N=4"] for r in rows] == pytest.approx([STRICT[1], STRICT[8], STRICT[32]], abs=1e-10)
    assert run.data.tags["relaxtune.stops_paying_at"] == "32" and run.data.tags["relaxtune.batch_size"] == "1"
    assert run.data.metrics["best_speedup_batch_32"] == pytest.approx(CACTUS[32], rel=1e-12)
    assert (
        json.loads(Path(client.download_artifacts(run.info.run_id, "cost_profile.json", str(tmp_path))).read_text())[
            "weights"
        ]
        == {"1": 1.0}
        if "cost_profile.json" in files
        else True
    )


def test_the_figure_plots_each_point_against_batch_size(at_32):
    config = at_32[1]
    fig = batch_figure(config, "speed-up by batch size")
    try:
        ax = fig.axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines["cactus delta=10 N=4"].get_xdata()) == [1, 8, 32]
        assert list(lines["cactus delta=10 N=4"].get_ydata()) == pytest.approx([CACTUS[b] for b in (1, 8, 32)])
        assert list(lines["strict N=4"].get_ydata()) == pytest.approx([STRICT[b] for b in (1, 8, 32)])
        assert list(lines["batched AR (plain decoding)"].get_ydata()) == [1.0, 1.0]
        assert list(lines["declared batch size 32"].get_xdata()) == [32, 32]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "stops paying from batch 32" in labels and "best confirmed point at that batch size" in labels
        assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["1", "8", "32"]
    finally:
        plt.close(fig)
    assert batch_figure(config.model_copy(update={"by_batch_size": None}), "x") is None


# --------------------------------------------------------------------------- relaxtune export --cost-profile


def job_settings(tmp_path: Path, uri: str, **over) -> TuneSettings:
    fields = dict(
        task=write_task(tmp_path / "task", 24, "reprice"),
        methods=["cactus"],
        n_drafts=[4],
        trials=4,
        stage_size=24,
        c_rel=0.2,
        epsilon=0.2,
        output_dir=str(tmp_path / "runs"),
        mlflow_uri=uri,
        confirm="seeds",
    )
    return TuneSettings(**(fields | over))


def run(settings: TuneSettings, new_trials: bool = True, **kwargs):
    return run_tune_job(
        settings,
        SyntheticPair(),
        progress=False,
        new_trials=new_trials,
        log=lambda m: None,
        evaluate_fn=Synthetic(cliff=20.0, delay=1e-4),  # records written: the export reads them back
        **kwargs,
    )


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow  # about 6-11 s: the default run stays under 8 minutes on 2 cores
def test_an_export_reprices_the_confirmed_points_with_the_serving_hosts_costs(tmp_path, monkeypatch, uri):
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts under ./mlruns
    s = job_settings(tmp_path, uri)
    tuned_config, tuned_path = run(s)  # priced at c_rel 0.2: cactus 4.6 / 1.8, strict 1.8 / 1.8
    assert tuned_config.methods["cactus"].modeled_speedup == pytest.approx(4.6 / 1.8, rel=1e-12)
    assert tuned_config.by_batch_size.best[1].modeled_speedup == pytest.approx(4.6 / 1.8, rel=1e-12)
    before = tuned_path.read_bytes()

    costs = write(tmp_path / "costs.json", serving({32: 1.0}).to_dict())  # the file's own weights: the job's win
    config, path = run(s, new_trials=False, cost_profile=costs)
    assert path == tmp_path / "runs" / "reprice.tuned.eps0.2.yaml" and load_config(path) == config
    assert tuned_path.read_bytes() == before  # the tuning run's config is never touched
    assert config.c_rel == 0.1 and config.serving_batch_sizes == [1, 8, 32]
    cactus = config.methods["cactus"]
    assert cactus.modeled_speedup == pytest.approx(CACTUS[1], rel=1e-12) and cactus.l_accept == 3.6
    assert cactus.confirmation["attempts"][-1]["modeled_speedup"] == pytest.approx(4.6 / 1.8, rel=1e-12)  # kept
    assert config.strict_by_n_draft[4]["modeled_speedup"] == pytest.approx(STRICT[1], rel=1e-12)
    assert config.by_batch_size.model_dump()["best"] == EXPECTED_BEST
    assert config.by_batch_size.stops_paying_at == 32
    assert (
        config.by_batch_size.line
        == "speculative decoding stops paying from batch 32 on the serving host that measured costs.json"
    )
    rec = config.recommendation
    assert (rec.method, rec.knob, rec.batch_size, rec.decoding) == ("cactus", 10.0, 1, "speculative")
    assert rec.modeled_speedup == pytest.approx(CACTUS[1], rel=1e-12)
    assert rec.strict_modeled_speedup == pytest.approx(STRICT[1], rel=1e-12)
    c = config.cost_profile
    assert (
        c["source"].startswith(f"{costs} (sha256 ") and "re-priced by `relaxtune export --cost-profile`" in c["source"]
    )
    assert c["tuning_c_rel"] == 0.2 and c["repriced"].endswith("keep the tuning run's prices (c_rel 0.2)")
    assert c["weights"] == {"1": 1.0} and ServingProfile.from_dict(c) == serving()

    client = MlflowClient(uri)
    export_run = client.get_run(config.mlflow["run_id"])
    files = {a.path for a in client.list_artifacts(export_run.info.run_id)}
    assert {"by_batch_size.json", "speedup_vs_batch_size.png", path.name} <= files
    assert export_run.data.tags["relaxtune.stops_paying_at"] == "32"
    assert export_run.data.params["c_rel"] == "0.1"

    exports = lambda: [  # noqa: E731
        r for r in client.search_runs([export_run.info.experiment_id]) if r.data.tags.get("relaxtune.kind") == "export"
    ]
    count = len(exports())
    refused = [  # what cannot price this job, refused before the export's MLflow run starts
        (
            {b: p for b, p in serving().profiles.items() if b != 1},
            "no cost profile at serving batch size 1, which the job declares \\(measured there: 8, 32\\)",
        ),
        (
            {1: CostProfile(1.0, 0.1, {3: 1.0, 9: 2.0})},
            "at batch size 1 it times verify\\(k\\) for k = 3, 9 but not k = N \\+ 1 for N = 4",
        ),
    ]
    for profiles, message in refused:
        bad = write(tmp_path / "bad.json", ServingProfile(profiles).to_dict())
        with pytest.raises(JobError, match=message):
            run(s.model_copy(update={"export": str(tmp_path / "bad.yaml")}), new_trials=False, cost_profile=bad)
    assert len(exports()) == count and not (tmp_path / "bad.yaml").exists()
    with pytest.raises(JobError, match="cannot re-price the search's trials .*--cost-profile FILE"):
        run(s.model_copy(update={"c_rel": 0.5}), new_trials=False, cost_profile=costs)

    old = write(tmp_path / "cost_profile.json", CostProfile(1.0, 0.1, {5: 5.0}).to_dict())  # a profile from before
    config, _ = run(s.model_copy(update={"export": str(tmp_path / "old.yaml")}), new_trials=False, cost_profile=old)
    assert list(config.by_batch_size.best) == [1] and config.by_batch_size.stops_paying_at == 1
    assert config.recommendation.method == "plain" and config.recommendation.batch_size == 1
    assert config.recommendation.fastest_speculative.modeled_speedup == pytest.approx(CACTUS[32], rel=1e-12)


def test_bad_cost_profile_files_are_refused_with_exit_2(tmp_path):
    cases = [
        (tmp_path / "missing.json", "no such file"),
        (tmp_path / "text.json", "not JSON"),
        (write(tmp_path / "list.json", [1, 2]), "not a cost profile \\(a JSON list, not an object\\)"),
        # the field and where it lacks, not Python's KeyError (fresh-venv trial)
        (write(tmp_path / "other.json", {"x": 1}), "not a cost profile: it lacks the field 't_ar'; give the JSON"),
        (
            write(tmp_path / "b16.json", {"batch_sizes": {"1": {"t_ar": 1.0, "t_draft": 0.1}, "16": {"t_ar": 2.0}}}),
            "not a cost profile: it lacks the field 't_draft' at batch size 16; give the JSON",
        ),
        (write(tmp_path / "empty.json", {"batch_sizes": {}}), "not a cost profile: it lacks the field 'batch_sizes'"),
        (write(tmp_path / "negative.json", {"t_ar": -1.0, "t_draft": 0.1}), "not a cost profile .*t_ar must be"),
    ]
    (tmp_path / "text.json").write_text("t_ar: 1")
    for path, message in cases:
        with pytest.raises(JobError, match=f"--cost-profile {path}: {message}"):
            read_cost_profile(path)
        out = CliRunner().invoke(
            app, ["export", "--task", "gsm8k", "--cost-profile", str(path)], env={"COLUMNS": "300"}
        )
        assert out.exit_code == 2 and "--cost-profile" in out.output, out.output
    single = read_cost_profile(write(tmp_path / "single.json", CostProfile(1.0, 0.2, {5: 1.5}, batch_size=1).to_dict()))
    assert single.batch_sizes == [1] and single.at(1).t_verify == {5: 1.5}


def test_an_export_refuses_a_cost_profile_without_the_jobs_verify_before_loading(tmp_path):
    """The job's draft lengths and batch sizes are checked against the file before any model
    loads (a fresh-venv trial saw the refusal only after "loading")."""
    costs = write(tmp_path / "costs.json", ServingProfile({1: CostProfile(1.0, 0.1, {3: 1.0})}).to_dict())
    args = ["export", "--task", "gsm8k", "--output-dir", str(tmp_path / "runs"), "--cost-profile", str(costs)]
    out = CliRunner().invoke(app, args + ["--n-drafts", "4"], env={"COLUMNS": "300"})
    assert out.exit_code == 2 and "loading" not in out.output, out.output
    assert "at batch size 1 it times verify(k) for k = 3 but not k = N + 1 for N = 4" in " ".join(out.output.split())
    out = CliRunner().invoke(app, args + ["--n-drafts", "2", "--serving-batch-size", "8"], env={"COLUMNS": "300"})
    assert out.exit_code == 2 and "loading" not in out.output, out.output
    assert "no cost profile at serving batch size 8, which the job declares" in " ".join(out.output.split())
