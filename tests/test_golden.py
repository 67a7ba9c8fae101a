"""The golden run of issue 33 (``scripts/golden_run.py``), kept as a test: the responses of every method on a
tiny float32 pair (and prompt lookup), one at a time and batched, and a tiny tuning job's records, Optuna trials
and tuned YAML equal, byte for byte, what the code before the one-protocol change (commit 6bddc2b) produced
(``tests/fixtures/golden``, written by that commit; timing fields, the decoding and grading code's source digests
and what schema v3 adds left out, as the script does)."""

import gzip
import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "golden"


def _golden():
    spec = importlib.util.spec_from_file_location("golden_run", ROOT / "scripts" / "golden_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected(name: str) -> str:
    return gzip.decompress((FIXTURES / f"{name}.gz").read_bytes()).decode()


@pytest.fixture
def one_thread():
    """The fixtures were written with one torch thread (a float32 sum's order depends on the threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_every_methods_responses_equal_the_base_commits(tmp_path, one_thread):
    _golden().engine_run(tmp_path)
    got, want = (tmp_path / "engine.jsonl").read_text().splitlines(), _expected("engine.jsonl").splitlines()
    assert len(got) == len(want) == 546
    assert [line for line in got if line not in want] == []
    assert got == want


def test_a_tuning_jobs_records_trials_and_config_equal_the_base_commits(tmp_path, one_thread):
    _golden().job_run(tmp_path / "out", tmp_path / "work", batches=(4,))
    names = sorted(p.relative_to(FIXTURES).as_posix()[:-3] for p in (FIXTURES / "job-b4").rglob("*.gz"))
    got = sorted(
        p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out" / "job-b4").rglob("*") if p.is_file()
    )
    assert got == names and len(names) == 7
    for name in names:
        golden = _golden()  # the base commit's file, cleaned as this code cleans (schema v3's additions dropped)
        assert (tmp_path / "out" / name).read_text() == golden.reclean(name, _expected(name)), name
