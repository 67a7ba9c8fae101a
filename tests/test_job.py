"""The main job end to end on a tiny model pair: CLI, MLflow on sqlite, exported config."""

import json
import os
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from relaxtune.certify.stats import smallest_certifiable_drop
from relaxtune.cli import app
from relaxtune.decoding.serving import ServingProfile
from relaxtune.decoding.speed import CostProfile
from relaxtune.report.export import load_config
from relaxtune.tune.estimate_history import host_key, recall

from .tiny_task import write_tiny_task


@pytest.mark.slow
def test_tune_cli_logs_to_mlflow_and_exports(tmp_path, tiny_pair_dirs, monkeypatch):
    import relaxtune.tune.estimate

    # the job keeps its measures only on a machine that does not look busy: this one is read as idle, so a loaded
    # CI host (load average above its cores) tests the same path (a busy job keeps nothing: test_estimate_history)
    monkeypatch.setattr(relaxtune.tune.estimate, "machine_load", lambda: (0.0, os.cpu_count() or 1))
    drafter, verifier = tiny_pair_dirs
    task = write_tiny_task(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "methods": ["cactus", "ens"],
                "trials": 2,
                "n_drafts": [2],
                "limit": 4,
                "dtype": "float32",
                "c_rel": 0.3,
                "stage_size": 2,
            }
        )
    )
    args = [
        "tune",
        "--config",
        str(cfg),
        "--task",
        task,
        "--drafter",
        drafter,
        "--verifier",
        verifier,
        "--output-dir",
        str(tmp_path / "runs"),
        "--mlflow-uri",
        uri,
        "--trials",
        "3",
        "--confirm",
        "seeds",
    ]  # flag beats file
    kept = tmp_path / "estimates"  # where the job keeps its measures for the next job's first estimate
    out = CliRunner().invoke(app, args, env={"COLUMNS": "250", "RELAXTUNE_ESTIMATES": str(kept)})
    assert out.exit_code == 0, out.output
    assert "recommendation" in out.output and "tuned config" in out.output
    text = " ".join(out.output.split())  # 4 problems cannot certify 0.05: the job and the summary say what would
    floor = smallest_certifiable_drop(4, 1, 0.975)  # 0.9 split over 2 methods x 2 confirmations
    assert "warning: no confirmation can pass: --confirm seeds confirms on the 4 problems, judged at 0.975" in text
    assert (
        f"with 4 problems x 1 a confirmation (4 problems, 97.5% one-sided) certifies no drop below {floor:.3f}" in text
    )
    assert "problems x 1 (--limit) would certify 0.05" in text
    assert "promise:" not in text  # no point exported: nothing is promised (the YAML keeps the rule's words)
    # where the time went (relaxtune.tune.phases): every phase of the job, the work counted, said in one line
    timing = json.loads((tmp_path / "runs" / "tiny_math.phases.json").read_text())
    names = [p["name"] for p in timing["phases"]]
    for name in ("imports", "model load", "start", "cost profile", "strict", "trials", "MLflow", "figures", "export"):
        assert name in names, names
    assert {p["name"] for p in timing["phases"] if p["overlapped"]} >= {"MLflow (tracker thread)", "grading"}
    assert "rests on priors (no earlier run of this task and pair in the cache)" in text
    (history,) = kept.rglob("*.json")  # <task>-v<version>/<pair>.json
    (run,) = recall(history).runs
    assert run.samples == timing["counts"]["samples generated"] > 0 and run.host == host_key()
    assert run.tokens_per_sample == pytest.approx(timing["counts"]["tokens decoded"] / run.samples)
    counts = timing["counts"]
    assert counts["samples generated"] == 4 * (1 + 3 + 3)  # strict and 3 trials per method (nothing to confirm)
    assert counts["figures drawn"] == 5  # the combined figure, and per method a Pareto and a speed-vs-knob one
    assert counts["tokens decoded"] > 0 and counts["rounds"] > 0
    assert f"phases and work counts: {tmp_path / 'runs' / 'tiny_math.phases.json'}" in text

    config = load_config(tmp_path / "runs" / "tiny_math.tuned.yaml")
    assert set(config.methods) == {"cactus", "ens"}
    assert config.methods["cactus"].trials == 3 and config.c_rel == 0.3
    assert config.task_version == 1 and config.drafter == drafter and config.problems == 4
    assert config.schema_version == 3  # v3 (issue 33): knobs, scope, serving batch sizes
    assert config.sample["smallest_certifiable"] == pytest.approx(floor, abs=1e-9)
    assert config.confirmation["samples"] == "seeds" and config.confirmation["per_method"] == 2
    assert config.recommendation.serving["relaxtune"]["n_draft"] == config.recommendation.n_draft

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("relaxtune-tiny_math")
    runs = client.search_runs([exp.experiment_id])
    kinds = {}
    for r in runs:
        kinds.setdefault(r.data.tags["relaxtune.kind"], []).append(r)
    assert len(kinds["task"]) == 1 and len(kinds["study"]) == 2 and len(kinds["trial"]) == 6
    task_run = kinds["task"][0]
    assert config.mlflow["run_id"] == task_run.info.run_id
    assert {s.data.tags["mlflow.parentRunId"] for s in kinds["study"]} == {task_run.info.run_id}
    study_ids = {s.info.run_id for s in kinds["study"]}
    assert all(t.data.tags["mlflow.parentRunId"] in study_ids for t in kinds["trial"])
    assert {"pareto_fronts_by_method.png", "tiny_math.tuned.yaml", "points.json", "figures"} <= {
        a.path for a in client.list_artifacts(task_run.info.run_id)
    }
    rec = config.recommendation  # the decision, readable on the task run's page
    assert (
        task_run.data.params["recommended_method"] == rec.method == task_run.data.tags["relaxtune.recommended_method"]
    )
    assert task_run.data.params["recommended_n_draft"] == str(rec.n_draft) and task_run.data.params["epsilon"] == "0.05"
    assert task_run.data.metrics["recommended_speedup"] == rec.modeled_speedup and task_run.data.params["n"] == "4"
    assert task_run.data.tags["mlflow.note.content"].startswith(
        f"Use {task_run.data.tags['relaxtune.recommended']} on "
    )
    assert task_run.info.run_name == f"tiny_math: use {task_run.data.tags['relaxtune.recommended']}"
    for s in kinds["study"]:
        knob = {"cactus": "delta", "ens": "alpha"}[s.data.tags["relaxtune.method"]]
        assert {"pareto_front.png", "pareto_front.json", f"speed_vs_{knob}.png"} <= {
            a.path for a in client.list_artifacts(s.info.run_id)
        }
        assert s.info.run_name.startswith(f"{s.data.tags['relaxtune.method']} study: ")
    trial = kinds["trial"][0]
    assert {"method", "knob", "n_draft", "trial", "task_version"} <= set(trial.data.params)
    assert (
        trial.info.run_name == f"{trial.data.params['method']} "
        f"{ {'cactus': 'delta', 'ens': 'alpha'}[trial.data.params['method']] }="
        f"{float(trial.data.params['knob']):.3g} N=2"
    )
    assert {"accuracy", "drop_ucb", "l_accept", "speedup", "speedup_c0.05", "length_ratio", "loop_rate"} <= set(
        trial.data.metrics
    )
    assert task_run.inputs.dataset_inputs[0].dataset.name == "tiny_math-v1"

    assert set(config.strict_by_n_draft) == {2} and config.recommendation.modeled_speedup > 0

    # a second run resumes: no new trials, no duplicate MLflow runs, the same strict baseline; --json: the
    # config alone on stdout, the progress on stderr
    out = CliRunner().invoke(app, args + ["--json"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    again = client.search_runs([exp.experiment_id])
    assert len(again) == len(runs)
    resumed = load_config(tmp_path / "runs" / "tiny_math.tuned.yaml")
    printed = json.loads(out.stdout)
    assert printed.pop("path") == str(tmp_path / "runs" / "tiny_math.tuned.yaml")
    assert printed == resumed.model_dump(mode="json") and "resuming" in out.stderr
    assert resumed.strict_by_n_draft == config.strict_by_n_draft and resumed.methods == config.methods
    study_run = next(r for r in again if r.data.tags.get("relaxtune.kind") == "study")
    table = json.loads(
        Path(client.download_artifacts(study_run.info.run_id, "pareto_front.json", str(tmp_path))).read_text()
    )
    kinds = [row[table["columns"].index("kind")] for row in table["data"]]
    assert "strict" in kinds and "ar" in kinds  # the resumed study's front keeps its references

    # export starts from the tuning run's settings: only the new epsilon is given; its own file and run
    tuned = (tmp_path / "runs" / "tiny_math.tuned.yaml").read_bytes()
    out = CliRunner().invoke(
        app,
        ["export", "--task", task, "--output-dir", str(tmp_path / "runs"), "--mlflow-uri", uri, "--epsilon", "0.5"],
        env={"COLUMNS": "250"},
    )
    assert out.exit_code == 0, out.output
    assert "reading the study of cactus" in out.output
    assert (tmp_path / "runs" / "tiny_math.tuned.yaml").read_bytes() == tuned
    exported = load_config(tmp_path / "runs" / "tiny_math.tuned.eps0.5.yaml")
    assert exported.epsilon == 0.5 and exported.problems == 4 and set(exported.methods) == {"cactus", "ens"}
    assert exported.strict_by_n_draft == config.strict_by_n_draft and exported.drafter == drafter
    export_run = client.get_run(exported.mlflow["run_id"])
    assert export_run.data.tags["relaxtune.kind"] == "export" and export_run.data.params["epsilon"] == "0.5"
    assert export_run.data.tags["mlflow.parentRunId"] == task_run.info.run_id

    # export re-judges, never re-runs: other problems, other prices or a method never tuned are refused
    base = ["export", "--task", task, "--output-dir", str(tmp_path / "runs"), "--mlflow-uri", uri]
    for extra, message in [
        (["--limit", "5"], "trials ran on 4 problems, this export asks for 5"),
        (["--limit", "3"], "trials ran on 4 problems, this export asks for 3"),
        (["--c-rel", "0.5"], "an export cannot re-price the search's trials"),
        (["--methods", "mentored"], "mentored (study tiny_math__mentored__"),
        (["--n-drafts", "8"], "trials ran at N=2, which --n-drafts 8 leaves out"),
    ]:
        out = CliRunner().invoke(app, base + extra, env={"COLUMNS": "250"})
        assert out.exit_code != 0 and message in " ".join(out.output.split()), (extra, out.output)
    assert load_config(tmp_path / "runs" / "tiny_math.tuned.eps0.5.yaml") == exported  # nothing overwritten
    assert (tmp_path / "runs" / "tiny_math.tuned.yaml").read_bytes() == tuned

    # a serving host's cost table re-prices strict and the confirmed points, no trial run; verify(3) costs 1 step
    # at batch 1 and 20 at batch 32, where nothing can pay: l_accept <= N = 2, so (l + 1) / (0.5 + 20) < 0.15
    costs = tmp_path / "serving-costs.json"
    serving = ServingProfile({b: CostProfile(1.0, 0.25, {3: v}, batch_size=b) for b, v in ((1, 1.0), (32, 20.0))})
    costs.write_text(json.dumps(serving.to_dict()))
    repriced_path = tmp_path / "repriced.yaml"
    out = CliRunner().invoke(
        app,
        base + ["--epsilon", "0.5", "--export", str(repriced_path), "--cost-profile", str(costs)],
        env={"COLUMNS": "250"},
    )
    assert out.exit_code == 0, out.output
    repriced = load_config(repriced_path)
    strict = repriced.strict_by_n_draft[2]
    assert strict["modeled_speedup"] == pytest.approx((min(strict["l_accept"], 2) + 1) / 1.5, rel=1e-12)
    assert repriced.c_rel == 0.25 and repriced.cost_profile["source"].startswith(f"{costs} (sha256 ")
    assert sorted(repriced.by_batch_size.best) == [1, 32] and repriced.by_batch_size.best[32].decoding == "plain"
    assert repriced.recommendation.batch_size == 1 and repriced.methods.keys() == exported.methods.keys()
    flat = " ".join(out.output.split())
    assert "best confirmed point by serving batch size" in flat
    assert "speculative decoding stops paying from batch" in flat and "on the serving host that measured" in flat
    costs.write_text(json.dumps(ServingProfile({8: CostProfile(1.0, 0.25, batch_size=8)}).to_dict()))
    out = CliRunner().invoke(app, base + ["--cost-profile", str(costs)], env={"COLUMNS": "250"})
    assert out.exit_code == 2 and "no cost profile at serving batch size 1" in " ".join(out.output.split())

    # the command that measures such a table on the serving host, end to end on the tiny pair, then the export
    measured = tmp_path / "measured.json"
    args = ["costs", "--task", task, "--drafter", drafter, "--verifier", verifier, "--runtime", "hf"]
    args += ["--dtype", "float32", "--n-drafts", "2", "--serving-batch-sizes", "1,2", "-o", str(measured)]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    profile = ServingProfile.from_dict(json.loads(measured.read_text()))
    assert profile.batch_sizes == [1, 2] and all(set(p.t_verify) == {3} for p in profile.profiles.values())
    assert f"relaxtune export --cost-profile {measured}" in " ".join(out.output.split())
    again = base + ["--export", str(tmp_path / "measured.yaml"), "--cost-profile", str(measured)]
    out = CliRunner().invoke(app, again, env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert load_config(tmp_path / "measured.yaml").serving_batch_sizes == [1, 2]


def test_costs_refuses_bad_input_before_a_model_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for extra, message in [
        (["-o", str(tmp_path / "no" / "such" / "costs.json")], "give a file in an existing folder"),
        (["-o", str(tmp_path)], "give a file in an existing folder"),
        (["-o", "c.json", "--serving-batch-sizes", "0,4"], "serving_batch_sizes must be integers >= 1"),
        (["-o", "c.json", "--n-drafts", "2,x"], "'x' is not an integer"),
        (["-o", "c.json", "--task", "no_such_task"], "no task 'no_such_task'"),
        (["-o", "c.json", "--drafter", str(tmp_path / "typo")], "typo"),
        (["-o", "c.json", "--runtime", "llamacpp", "--serving-batch-sizes", "1,100000"], "hold 256 sequences"),
        # found by a fresh-venv trial: each reached the model load
        (["-o", "/proc/x.json"], "--output /proc/x.json: cannot write a file there"),
        (["-o", "c.json", "--n-drafts", "100000"], "a draft length of 100000 exceeds the task's 384-token response"),
        (["-o", "c.json", "--serving-batch-sizes", "1,,2"], "--serving-batch-sizes: '1,,2' has an empty item"),
        (
            ["-o", "c.json", "--serving-batch-sizes", "1,1,2"],
            "--serving-batch-sizes 1,1,2: batch size 1 is given twice",
        ),
        # ten more of the kind
        (["-o", "c.json", "--serving-batch-sizes", "1,2,"], "'1,2,' has an empty item"),
        (["-o", "c.json", "--serving-batch-sizes", " "], "has an empty item"),
        (["-o", "c.json", "--serving-batch-sizes", "auto,4"], "'auto' is not an integer"),
        (["-o", "c.json", "--serving-batch-sizes", "1.5"], "'1.5' is not an integer"),
        (["-o", "c.json", "--serving-batch-sizes", "-4"], "serving_batch_sizes must be integers >= 1"),
        (["-o", "c.json", "--n-drafts", "0"], "n_drafts must be integers >= 1"),
        (["-o", "c.json", "--n-drafts", "4,385"], "a draft length of 385 exceeds"),
        (["-o", "read-only.json"], "--output read-only.json: cannot write a file there"),
        (["-o", ""], "give a file in an existing folder"),
    ]:
        if extra[1] == "read-only.json":
            (tmp_path / "read-only.json").write_text("{}")
            (tmp_path / "read-only.json").chmod(0o444)
            if os.access(tmp_path / "read-only.json", os.W_OK):  # root writes any file: nothing to refuse
                continue
        out = CliRunner().invoke(app, ["costs", *extra], env={"COLUMNS": "250"})
        assert out.exit_code == 2 and message in " ".join(out.output.split()), (extra, out.output)
    assert not (tmp_path / "c.json").exists() and not list(tmp_path.glob(".relaxtune-costs-*"))
    help_text = " ".join(CliRunner().invoke(app, ["costs", "--help"], env={"COLUMNS": "250"}).output.split())
    assert "serving batch sizes to measure at, each once" in help_text and "declared" not in help_text


def test_costs_noisy_flags_advise_what_costs_can_do():
    """`relaxtune costs` has no --remeasure-costs or --c-rel: its noisy warning says to run it again."""
    from relaxtune.cli.costs import COSTS_ADVICE, with_costs_advice

    flag = (
        "noisy measurement: spread t_ar 24% after 10 interleaved passes (tolerance 10%); other work was running: "
        "re-measure on an idle machine (--remeasure-costs) or give --c-rel"
    )
    profile = ServingProfile(
        {1: CostProfile(1.0, 0.2, {3: 1.5}, flags=[flag]), 4: CostProfile(2.0, 0.5, {3: 3.0}, batch_size=4)}
    )
    ours = with_costs_advice(profile)
    assert ours.at(1).flags == [
        "noisy measurement: spread t_ar 24% after 10 interleaved passes (tolerance 10%)" + COSTS_ADVICE
    ]
    assert ours.at(4).flags == [] and ours.at(1).t_ar == 1.0 and ours.weights == profile.weights
    assert "--remeasure-costs" not in COSTS_ADVICE and "--c-rel" not in COSTS_ADVICE


def test_tune_refuses_a_declared_batch_size_beyond_llamacpps_slots_before_loading():
    """With --serving-batch-sizes auto the declared or weighted size is measured too: above the
    contexts' sequences it reached the load (invented bad input)."""
    for extra, message in [
        (["--serving-batch-size", "300"], "batch size 300 is measured too, but llama.cpp's contexts hold 16 sequences"),
        (["--serving-batch-weights", "1=0.5,64=0.5"], "give sizes up to 16, or --batch-size 64"),
        (["--serving-batch-weights", "1=0.5,,16=0.5"], "'1=0.5,,16=0.5' has an empty item"),
        (["--serving-batch-weights", "1=0.5,1=0.5"], "batch size 1 is given twice"),
    ]:
        args = ["tune", "--task", "humaneval", "--runtime", "llamacpp", *extra]
        out = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
        flat = " ".join(out.output.split())
        assert out.exit_code == 2 and message in flat and "loading" not in flat, (extra, out.output)


def test_tune_cli_refuses_bad_input_early(tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["tune", "--task", "humaneval", "--methods", "cactus,nope"], env={"COLUMNS": "250"})
    assert out.exit_code != 0 and "unknown method 'nope'" in " ".join(out.output.split())
    out = runner.invoke(app, ["tune", "--task", "no_such_task"], env={"COLUMNS": "250"})
    assert out.exit_code != 0 and "no task 'no_such_task'" in " ".join(out.output.split())
    out = runner.invoke(app, ["tune", "--task", "humaneval", "--epsilon", "2"], env={"COLUMNS": "250"})
    assert out.exit_code != 0 and "epsilon" in out.output
    import relaxtune

    greedy = tmp_path / "greedy.yaml"  # humaneval at temperature 0
    greedy.write_text(
        (Path(relaxtune.__file__).parent / "evals" / "humaneval.yaml")
        .read_text()
        .replace("temperature: 0.6", "temperature: 0")
    )
    for task, methods, message in [  # refused by the task alone: said before the loading line, nothing loads
        ("humaneval", "trtllm_relaxed", "is greedy-only as its engine runs it: it ignores the temperature (here 0.6)"),
        (str(greedy), "sglang_threshold", "method 'sglang_threshold' collapses to strict at temperature 0"),
        ("humaneval", "fly", "--methods fly with --n-drafts 1: method 'fly' cannot run at draft length N=1"),
    ]:
        extra = ["--n-drafts", "1"] if methods == "fly" else []
        out = runner.invoke(app, ["tune", "--task", task, "--methods", methods, *extra], env={"COLUMNS": "250"})
        assert out.exit_code == 2 and message in " ".join(out.output.split()), out.output
        assert "loading" not in out.output


def test_serving_arguments_name_the_upstream_models():
    from relaxtune.report.export import serving_args

    args = serving_args("strict", None, 4, "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", {})
    launch = args["sglang_launch_args"]
    assert launch[launch.index("--model-path") + 1] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert launch[launch.index("--speculative-draft-model-path") + 1] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert args["relaxtune"]["drafter"] == "qwen2.5-coder-0.5b-instruct"  # relaxtune's own name still works there
    assert "/my/verifier" in serving_args("strict", None, 2, "/my/drafter", "/my/verifier", {})["sglang_launch_args"]
