"""`relaxtune deploy-check` end to end on a tiny pair saved to disk and a tiny task:
ens agrees with transformers' assisted generation, the N+1 control disagrees, and
points transformers cannot run are refused by name."""

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from relaxtune.cli import app
from relaxtune.report.export import save_config

from .test_deploy_export import tune
from .tiny_models import save_tiny_model
from .tiny_task import write_tiny_task

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deploy_check")
    _, config = tune(tmp / "tune", 0.2, cliff=-1.0, drop=0.25)
    d = save_tiny_model(tmp / "drafter", seed=0, noise=0.5)
    v = save_tiny_model(tmp / "verifier", seed=0, noise=0.0)
    config = config.model_copy(
        update={
            "drafter": d,
            "verifier": v,
            "dtype": "float32",
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": None},
        }
    )
    return str(save_config(config, tmp / "tiny.tuned.yaml")), write_tiny_task(tmp, max_new_tokens=40)


def check(files, *extra):
    torch.set_num_threads(1)
    path, task = files
    return runner.invoke(
        app,
        [
            "deploy-check",
            path,
            "--task",
            task,
            "--method",
            "ens",
            "--knob",
            "alpha=0.2",
            "--n-draft",
            "3",
            "--problems",
            "6",
            "--samples",
            "8",
            "--min-rounds",
            "100",
            "--device",
            "cpu",
            *extra,
        ],
    )


@pytest.mark.slow
def test_agree_then_the_control_disagrees(files):
    ok = check(files)
    assert ok.exit_code == 0, ok.output
    assert "assistant_ensemble_weight=0.8, N=3" in ok.output and ok.output.rstrip().endswith(
        "verdict: agree (alpha 0.01)"
    )
    assert "accuracy: relaxtune - transformers" in ok.output
    progress = [line for line in ok.output.splitlines() if " responses, " in line]  # one line a response, each side
    assert len(progress) == 2 * int(progress[0].split("/")[1].split()[0])
    assert progress[0].startswith("relaxtune: 1/") and progress[-1].startswith("transformers: ")
    control = check(files, "--control", "n+1")
    assert control.exit_code == 0, control.output
    assert "(negative control: n+1)" in control.output
    assert control.output.rstrip().endswith("verdict: disagree (alpha 0.01)")


def test_methods_transformers_does_not_run_are_refused(files):
    path, task = files
    out = runner.invoke(app, ["deploy-check", path, "--task", task, "--method", "fly"])
    assert out.exit_code == 2
    assert (
        "refused: deploy-check runs transformers' assisted generation, which runs strict and ens only; fly runs on vllm"
        in out.output
    )
    out = runner.invoke(app, ["deploy-check", path, "--task", task, "--method", "ens"])
    assert out.exit_code == 2 and "no confirmed point of ens in the config: give --knob alpha=VALUE" in out.output
    out = runner.invoke(app, ["deploy-check", path, "--method", "ens", "--knob", "alpha"])
    assert out.exit_code == 2 and "--knob takes NAME=VALUE" in out.output


def test_a_plain_recommendation_is_refused_by_name_and_its_fastest_point_checked_on_request(tmp_path):
    from relaxtune.cli.deploy_check import resolve_point

    _, config = tune(tmp_path, 0.9, cliff=-1.0, drop=0.25, strict_accept=0.05)  # nothing pays: plain decoding
    path = str(save_config(config, tmp_path / "plain.tuned.yaml"))
    out = runner.invoke(app, ["deploy-check", path])
    assert out.exit_code == 2
    assert " ".join(out.output.split()) == (
        "refused: the recommendation is plain decoding (serve the verifier alone): no speculative rule to check; "
        "give --method to check a point anyway (the fastest speculative (strict N=4): --method strict)"
    )
    assert resolve_point(config, "strict", None, None) == ("strict", 0.0, 4)  # the fastest speculative point's N
    assert resolve_point(config, "ens", {"alpha": 0.2}, None) == ("ens", 0.2, 4)
    with pytest.raises(ValueError, match="no confirmed point of ens in the config"):
        resolve_point(config, "ens", None, None)


def test_only_the_transformers_runtime_is_checked(files):
    path, task = files
    out = runner.invoke(app, ["deploy-check", path, "--task", task, "--runtime", "llamacpp"])
    assert out.exit_code == 2 and "refused: --runtime llamacpp: transformers runs its own weights" in out.output


def test_a_bad_dtype_and_a_config_the_schema_refuses_exit_2_before_any_load(files, tmp_path):
    path, task = files
    out = runner.invoke(app, ["deploy-check", path, "--task", task, "--method", "strict", "--dtype", "x"])
    assert out.exit_code == 2 and "refused: --dtype x: give one of bfloat16, float16, float32" in out.output
    bad = tmp_path / "bad.tuned.yaml"
    bad.write_text(Path(path).read_text().replace("recommendation:", "recommendation:\n  surplus: 1", 1))
    out = runner.invoke(app, ["deploy-check", str(bad), "--task", task])
    assert out.exit_code == 2 and f"refused: {bad} is not a tuned config relaxtune can read" in out.output
    out = runner.invoke(app, ["deploy-check", str(tmp_path / "none.yaml"), "--task", task])
    assert out.exit_code == 2 and f"refused: {tmp_path / 'none.yaml'}: no such file (give the tuned" in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n-draft", "0"], "Invalid value for '--n-draft': Input should be greater than or equal to 1"),
        (["--n-draft", "100000"], "--n-draft 100000: a draft length of 100000 exceeds the task's 40-token"),
        (["--problems", "0"], "Invalid value for '--problems': Input should be greater than or equal to 1"),
        (["--samples", "-1"], "Invalid value for '--samples': Input should be greater than or equal to 1"),
        (["--min-rounds", "0"], "Invalid value for '--min-rounds': Input should be greater than or equal to 1"),
        (["--alpha", "2"], "refused: --alpha 2.0: a significance level lies in (0, 1)"),
        (["--alpha", "nan"], "refused: --alpha nan: a significance level lies in (0, 1)"),
        (["--task", "no_such_task"], "refused: no task 'no_such_task'"),
    ],
)
def test_numbers_and_tasks_deploy_check_cannot_run_are_refused_before_any_load(files, args, message):
    path, task = files
    base = ["deploy-check", path, "--method", "ens", "--knob", "alpha=0.2"]
    out = runner.invoke(app, base + (args if "--task" in args else ["--task", task, *args]))
    assert out.exit_code == 2 and message in " ".join(out.output.replace("│", " ").split()), out.output


@pytest.mark.parametrize(
    ("text", "message"),
    [("recommendation: [unclosed\n", "is not YAML"), ("", "holds nothing"), ("- a\n- b\n", "holds list")],
)
def test_a_file_that_is_no_tuned_config_is_refused_by_name(tmp_path, files, text, message):
    bad = tmp_path / "bad.tuned.yaml"
    bad.write_text(text)
    out = runner.invoke(app, ["deploy-check", str(bad), "--task", files[1]])
    assert out.exit_code == 2 and f"refused: {bad} is not a tuned config relaxtune can read" in out.output
    assert message in out.output
