"""Every runnable benchmark (``python -m relaxtune.bench.X``) in its short form, in a
subprocess as a user runs it, its JSON checked for structure (never for timings), so a
change in the code or a library that breaks a benchmark is caught (issue 37: the default
engine benchmark died on a transformers upgrade unnoticed). Marked ``slow`` (``.ci/run``
runs the slow kinds): a few minutes on 2 cores. The benchmarks on the embedded pair skip
unless its files are already in the cache (tests never assemble or download models); the
llama.cpp ones without ``llama_cpp``. The soak benchmark's short form is
``tests/test_soak.py`` (marker ``soak``)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relaxtune.backends.embedded import DRAFTER, VERIFIER, cache_dir

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
CONVERTED = all((cache_dir() / m.name / "hf" / "config.json").is_file() for m in (DRAFTER, VERIFIER))
GGUFS = all((cache_dir() / m.name / "model.gguf").is_file() for m in (DRAFTER, VERIFIER))
LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_hf_pair = pytest.mark.skipif(not CONVERTED, reason="the embedded pair is not converted in the cache")
needs_gguf_pair = pytest.mark.skipif(
    not (GGUFS and LLAMA), reason="the embedded GGUF files or llama-cpp-python are missing"
)


def run(tmp_path: Path, benchmark: str, *args: str, timeout: float = 600) -> dict:
    """Run ``python -m relaxtune.bench.<benchmark> *args --json FILE`` from this tree and
    return its JSON (the run must exit 0)."""
    out = tmp_path / f"{benchmark}.json"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(
        [sys.executable, "-m", f"relaxtune.bench.{benchmark}", *args, "--json", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{benchmark} {args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    result = json.loads(out.read_text())
    assert result["benchmark"] == benchmark and result["command"].startswith(f"python -m relaxtune.bench.{benchmark}")
    assert "--json" not in result["command"] and result["machine"]["cores"] >= 1 and result["tables"]
    for table in result["tables"]:
        assert table["rows"] and all(len(row) == len(table["columns"]) for row in table["rows"])
    return result


def columns(result: dict) -> list[list[str]]:
    return [t["columns"] for t in result["tables"]]


def test_coverage(tmp_path):
    r = run(tmp_path, "coverage", "--quick", "--confidence", "0.9", "--datasets", "200")
    assert len(r["tables"][0]["rows"]) == 2 * 2 * 6 and columns(r)[0][4] == "product bound"


def test_round(tmp_path):
    r = run(tmp_path, "round", "--quick", "--vocab", "1024", "--batches", "1,2", "--methods", "cactus,mentored")
    (table,) = r["tables"]
    assert table["columns"] == ["method", "B", "N", "round ms", "softmax ms", "ratio", "target"]
    assert {(row[0], row[1], row[2]) for row in table["rows"]} == {
        (m, b, n) for m in ("cactus", "mentored") for b in (1, 2) for n in (3, 10)
    }


def test_selection_and_planner(tmp_path):
    r = run(tmp_path, "selection", "--jobs", "2", "--candidates", "3", "--problems", "30", "--confirm", "holdout")
    assert columns(r) == [["harm", "outcomes", "candidates", "--confirm holdout"]] and len(r["tables"][0]["rows"]) == 6
    r = run(tmp_path, "selection", "--planner", "--datasets", "20")
    assert columns(r)[0][0] == "c" and len(r["tables"][0]["rows"]) == 4


def test_tuning(tmp_path):
    r = run(tmp_path, "tuning", "--tasks", "1", "--families", "gpqa", "--methods", "cactus", "--jobs", "1")
    (table,) = r["tables"]
    assert [row[0] for row in table["rows"]] == ["search", "grid", "random"]
    assert table["notes"][0].startswith("target: the search reaches the grid's pick")


def test_scale(tmp_path):
    r = run(tmp_path, "scale", "--quick", "--workers", "1,2")
    (table,) = r["tables"]
    assert [row[0] for row in table["rows"]] == [1, 2] and [row[-1] for row in table["rows"]] == ["yes", "yes"]


def test_serving_on_the_simulated_pair(tmp_path):
    r = run(tmp_path, "serving", "--runtime", "simulated", "--short")
    (table,) = r["tables"]
    assert [row[0] for row in table["rows"]] == [1, 2] and table["columns"][5] == "strict modeled"


@needs_hf_pair
def test_engine_on_transformers(tmp_path):
    """The default runtime on the embedded pair (which has an EOS id): issue 37's break."""
    r = run(tmp_path, "engine", "--short", "--dtype", "bfloat16", "--device", "cpu")
    single, batch = r["tables"]
    assert [row[0] for row in single["rows"]] == [2] and [row[0] for row in batch["rows"]] == [1, 2]
    assert all(v > 0 for v in single["rows"][0][1:6])


@needs_gguf_pair
def test_engine_on_llamacpp(tmp_path):
    r = run(tmp_path, "engine", "--short", "--runtime", "llamacpp")
    (table,) = r["tables"]
    assert table["columns"][:4] == ["B", "L tok/s", "S tok/s", "S l_accept"] and [x[0] for x in table["rows"]] == [1, 2]


@needs_gguf_pair
def test_drafters(tmp_path):
    r = run(tmp_path, "drafters", "--quick", "--runtime", "llamacpp", "--methods", "strict,cactus:1")
    (table,) = r["tables"]
    assert [row[:2] for row in table["rows"]] == [
        ["LM 0.5B", "strict"],
        ["LM 0.5B", "cactus 1"],
        ["prompt-lookup", "strict"],
        ["prompt-lookup", "cactus 1"],
    ]


@needs_gguf_pair
def test_serving_on_llamacpp(tmp_path):
    from relaxtune.backends.llamacpp import LlamaCppBackend

    if "batch_sizes" not in inspect.signature(LlamaCppBackend.cost_profile).parameters:
        pytest.skip("the llama.cpp backend does not measure serving batch sizes yet (cost_profile(batch_sizes=))")
    r = run(tmp_path, "serving", "--short")
    (table,) = r["tables"]
    assert [row[0] for row in table["rows"]] == [1, 2] and table["notes"][0].startswith("speculation stops paying")
