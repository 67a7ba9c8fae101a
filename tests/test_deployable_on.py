"""``relaxtune tune --deployable-on ENGINE``: the methods the named engines run at the
task's sampling are kept, the rest refused by name, before any model loads."""

import pytest
from typer.testing import CliRunner

from relaxtune.cli import app
from relaxtune.job.steps import deployable
from relaxtune.report.reexport import JobError
from relaxtune.tune.settings import TuneSettings


def test_keeps_what_the_engines_run_and_names_the_rest():
    said = []
    settings = TuneSettings(
        task="humaneval", methods=["cactus", "ens", "sglang_threshold"], deployable_on=["transformers", "sglang"]
    )
    kept = deployable(settings, said.append)
    assert kept.methods == ["ens", "sglang_threshold"]  # humaneval samples at 0.6: both run there
    assert said == [
        "--deployable-on transformers,sglang: refused cactus: not run by transformers, sglang (runs on no engine)"
    ]
    assert kept.deployable_on is None  # applied once: the job's start does not apply it again
    assert "deployable_on" not in kept.model_dump()  # applied where the job starts; the kept methods are recorded


def test_nothing_left_is_refused_naming_each_method():
    settings = TuneSettings(task="humaneval", methods=["cactus", "mentored"], deployable_on=["vllm"])
    with pytest.raises(JobError, match=r"no method of --methods cactus,mentored runs there \(cactus: not run by vllm"):
        deployable(settings, lambda m: None)


@pytest.mark.parametrize(
    ("engines", "message"),
    [
        ("vllm", "no method of --methods cactus runs there"),
        ("tensorrt", "engines are vllm, sglang, trtllm, transformers; got tensorrt"),
    ],
)
def test_the_cli_refuses_before_any_model_loads(tmp_path, engines, message):
    res = CliRunner().invoke(
        app,
        [
            "tune",
            "--task",
            "humaneval",
            "--methods",
            "cactus",
            "--deployable-on",
            engines,
            "--runtime",
            "hf",
            "--output-dir",
            str(tmp_path / "runs"),
        ],
        env={"COLUMNS": "300"},
    )
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split())
    assert not (tmp_path / "runs").exists()


def test_the_engines_round_level_rules_are_taken_by_methods_and_filtered_as_any_other():
    said = []
    settings = TuneSettings(
        task="humaneval", methods=["fly", "trtllm_relaxed", "ens"], deployable_on=["vllm", "trtllm"]
    )
    kept = deployable(settings, said.append)
    assert kept.methods == ["fly"]  # humaneval samples at 0.6: TensorRT-LLM's relaxed acceptance is greedy-only
    assert said == [
        "--deployable-on vllm,trtllm: refused trtllm_relaxed: TensorRT-LLM runs relaxed acceptance greedy only; "
        "the task samples at temperature 0.6",
        "--deployable-on vllm,trtllm: refused ens: not run by vllm, trtllm (runs on transformers)",
    ]


def test_the_cli_takes_fly_and_trtllm_relaxed_as_method_ids(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "tune",
            "--task",
            "humaneval",
            "--methods",
            "fly,trtllm_relaxed",
            "--deployable-on",
            "sglang",
            "--runtime",
            "hf",
            "--output-dir",
            str(tmp_path / "runs"),
        ],
        env={"COLUMNS": "300"},
    )
    assert res.exit_code == 2, res.output  # both known (no "unknown method"), both refused by the engine filter
    out = " ".join(res.output.split())
    assert "no method of --methods fly,trtllm_relaxed runs there (fly: not run by sglang (runs on vllm)" in out
    assert "unknown method" not in out
