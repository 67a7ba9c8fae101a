"""The command line on a tiny local model pair (no downloads)."""

import json

import pytest
import typer
from typer.testing import CliRunner

from relaxtune.backends.hf import load_pair
from relaxtune.cli import app

from .tiny_models import VOCAB, save_tiny_model
from .tiny_task import write_tiny_task

runner = CliRunner()


@pytest.fixture
def pair_dirs(tiny_pair_dirs):
    return tiny_pair_dirs


def test_methods_lists_every_method():
    out = runner.invoke(app, ["methods"], env={"COLUMNS": "200"})
    assert out.exit_code == 0
    for name in ("strict", "cactus", "spec_cont_dec", "[0, 1)", "ln 2"):
        assert name in out.output


def test_generate_on_a_local_pair(pair_dirs):
    drafter, verifier = pair_dirs
    out = runner.invoke(
        app,
        [
            "generate",
            "def f(x):",
            "--method",
            "cactus",
            "--alpha",
            "1",
            "--drafter",
            drafter,
            "--verifier",
            verifier,
            "--dtype",
            "float32",
            "--max-new-tokens",
            "24",
            "--temperature",
            "0.8",
        ],
        env={"COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    assert "decoding statistics" in out.output and "measured wall-clock speed-up over AR" in out.output
    assert "cactus" in out.output and "ar" in out.output


@pytest.mark.parametrize(
    "args, match",
    [
        (["--method", "nope"], "unknown method 'nope'"),
        (["--method", "mentored", "--alpha", "1.5"], "outside the valid range"),
        (["--method", "cactus", "--temperature", "0"], "collapses to strict"),
    ],
)
def test_generate_rejects_bad_input_before_loading(args, match):
    out = runner.invoke(app, ["generate", "x", "--verifier", "/nonexistent", *args], env={"COLUMNS": "300"})
    assert out.exit_code != 0
    assert match in " ".join(out.output.split())


def test_pairs_with_different_tokenizers_are_refused(tmp_path, pair_dirs):
    other = save_tiny_model(tmp_path / "other", vocab=list(reversed(VOCAB)))
    with pytest.raises(ValueError, match="different tokenizers"):
        load_pair(other, pair_dirs[1], dtype="float32")


def test_eval_takes_a_batch_size(pair_dirs, tmp_path):
    drafter, verifier = pair_dirs
    task = write_tiny_task(tmp_path)
    outputs = {}
    for size in ("1", "3"):
        out = runner.invoke(
            app,
            [
                "eval",
                "--task",
                task,
                "--limit",
                "4",
                "--drafter",
                drafter,
                "--verifier",
                verifier,
                "--dtype",
                "float32",
                "--batch-size",
                size,
                "--output-dir",
                str(tmp_path / size),
            ],
            env={"COLUMNS": "200"},
        )
        assert out.exit_code == 0, out.output
        (records,) = (tmp_path / size).rglob("*.jsonl")
        outputs[size] = sorted(
            (r["problem_id"], r["output"]) for r in map(json.loads, records.read_text().splitlines())
        )
    assert outputs["1"] == outputs["3"] and len(outputs["3"]) == 4
    again = runner.invoke(
        app,
        [
            "eval",
            "--task",
            task,
            "--limit",
            "4",
            "--drafter",
            drafter,
            "--verifier",
            verifier,
            "--dtype",
            "float32",
            "--output-dir",
            str(tmp_path / "3"),
        ],
        env={"COLUMNS": "200"},
    )
    assert again.exit_code == 0 and "4 of 4 samples were read back from these records, not generated now" in " ".join(
        again.output.split()
    )  # the same configuration again: nothing generated, and it says so
    assert "read back" not in out.output
    out = runner.invoke(app, ["eval", "--task", task, "--batch-size", "0"], env={"COLUMNS": "200"})
    assert out.exit_code != 0 and "batch-size" in out.output


def test_tune_options_parse_batch_size_and_remeasure():
    from relaxtune.cli.options import settings_from

    s = settings_from(None, {"task": "humaneval", "batch_size": 4, "remeasure_costs": True})
    assert s.batch_size == 4 and s.remeasure_costs
    assert settings_from(None, {"task": "humaneval"}).batch_size is None  # the device's default
    with pytest.raises(typer.BadParameter, match="--batch-size"):
        settings_from(None, {"task": "humaneval", "batch_size": 0})
