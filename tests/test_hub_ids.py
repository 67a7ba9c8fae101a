"""A hub id is checked before any model loads: found in the Hugging Face cache, refused
offline or when the hub says there is no such model (naming the flag); and a job whose
SGLang servers do not answer leaves no file behind (its task's ``spec.json`` is written
with the first record, not at the start)."""

from __future__ import annotations

import re

import httpx
import huggingface_hub
import huggingface_hub.constants
import pytest
import typer
from huggingface_hub.errors import RepositoryNotFoundError
from typer.testing import CliRunner

from relaxtune.cli import app
from relaxtune.cli.checks import check_hub_id

from .hub_cache import cache_hub_model
from .tiny_task import write_tiny_task


def test_a_cached_hub_model_passes_and_an_uncached_one_offline_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cache_hub_model(tmp_path, "org/model", "config.json")
    cache_hub_model(tmp_path, "org/tok", "tokenizer.json")
    assert check_hub_id("--verifier", "org/model") is None
    assert check_hub_id("--tokenizer", "org/tok", ("tokenizer_config.json", "tokenizer.json")) is None
    with pytest.raises(typer.BadParameter) as err:
        check_hub_id("--tokenizer", "org/tok")  # no config.json of it cached
    assert str(err.value) == (
        "--tokenizer org/tok: not in the Hugging Face cache and HF_HUB_OFFLINE is set; download it "
        "(`hf download org/tok`), or give a model folder"
    )


def test_online_the_hub_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    asked = []

    def missing(self, repo, **kwargs):
        asked.append((repo, kwargs.get("timeout")))
        request = httpx.Request("GET", f"https://huggingface.co/api/models/{repo}")
        raise RepositoryNotFoundError("404", response=httpx.Response(404, request=request))

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", missing)
    with pytest.raises(typer.BadParameter, match=r"^--drafter org/typo: no such model on the Hugging Face hub"):
        check_hub_id("--drafter", "org/typo")

    def unreachable(self, repo, **kwargs):
        raise httpx.ConnectError("no route")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    with pytest.raises(typer.BadParameter, match=r"^--drafter org/typo: not in the Hugging Face cache and the hub "):
        check_hub_id("--drafter", "org/typo")
    assert asked == [("org/typo", 10)]  # asked once, within 10 s


def test_unreachable_servers_are_refused_and_leave_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = write_tiny_task(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    args = ["tune", "--task", task, "--methods", "cactus", "--n-drafts", "2", "--trials", "1"]
    args += ["--drafter-url", "http://127.0.0.1:9", "--verifier-url", "http://127.0.0.1:9", "--output-dir", "runs"]
    out = CliRunner().invoke(app, [*args, "--mlflow-uri", f"sqlite:///{tmp_path / 't.db'}"], env={"COLUMNS": "300"})
    message = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out.output).split())
    assert out.exit_code == 2, message
    assert "drafter server at http://127.0.0.1:9 is unreachable" in message
    assert {p.name for p in tmp_path.iterdir()} - before <= {"t.db"}  # no output folder, no spec.json
    assert not (tmp_path / "runs").exists()
