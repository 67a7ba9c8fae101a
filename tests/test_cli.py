"""The command line on a tiny local model pair (no downloads)."""

import pytest
from typer.testing import CliRunner

from relaxtune.backends.hf import load_pair
from relaxtune.cli import app

from .tiny_models import VOCAB, save_tiny_model

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
        ["generate", "def f(x):", "--method", "cactus", "--alpha", "1", "--drafter", drafter, "--verifier", verifier,
         "--dtype", "float32", "--max-new-tokens", "24", "--temperature", "0.8"],
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
