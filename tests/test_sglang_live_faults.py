"""Faults against real SGLang 0.5.23 servers (``live_sglang``): a server killed mid-evaluation
and restarted, one that dies or never becomes ready, a wrong port, another model than named.
The stand-in server (``relaxtune.testing.sglang_standin``) keeps only the faults a real server
cannot be made to produce (5xx bodies, truncated JSON, impossible counters)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from relaxtune.backends.load import load_backend
from relaxtune.backends.sglang import SGLangBackend, SGLangError
from relaxtune.backends.sglang_launch import ServerSpec, launch
from relaxtune.tune.evaluation import evaluate
from relaxtune.tune.point_records import DecodeConfig

from .sglang_live import free_port, sglang_python
from .test_evaluation import tiny_task

pytestmark = pytest.mark.live_sglang


def test_a_server_killed_mid_evaluation_fails_its_samples_and_the_job_resumes_after_a_restart(live_pair, tmp_path):
    from relaxtune.backends.hf import load_pair

    spec = tiny_task(repeats=3)  # 6 problems x 3 = 18 samples
    config = DecodeConfig("cactus", 1.0, 2, seed=7)
    backend = SGLangBackend(
        *live_pair.urls, live_pair.verifier, top_logprobs=64, retries=1, backoff=0.2, max_concurrency=2
    )
    out: dict = {}
    run = threading.Thread(
        target=lambda: out.update(first=evaluate(spec, backend, config, output_dir=tmp_path, progress=False))
    )
    run.start()
    verifier = live_pair.processes[1]
    deadline = time.monotonic() + 300
    records = None
    while time.monotonic() < deadline and run.is_alive():
        records = next(tmp_path.rglob("*.jsonl"), None)
        if records is not None and len(records.read_text().splitlines()) >= 2:
            break
        time.sleep(0.1)
    os.killpg(verifier.proc.pid, signal.SIGKILL)  # the whole server, mid-evaluation
    run.join(600)
    first = out["first"]
    assert first.failed > 0 and first.n + first.failed == 18
    failed = [r for r in first.records if r["failed"]]
    assert all(r["verdict"] == "generation_error" and "verifier server at" in r["error"] for r in failed)
    live_pair.restart(1)
    resumed = evaluate(spec, backend, config, output_dir=tmp_path, progress=False)
    backend.close()
    assert resumed.failed == 0 and resumed.n == 18  # the failed samples ran again
    kept = {(r["problem_id"], r["repeat"]): r for r in first.records if not r["failed"]}
    again = {(r["problem_id"], r["repeat"]): r for r in resumed.records}
    assert all(again[k] == r for k, r in kept.items())  # the finished ones were read back as they were
    local = evaluate(
        spec,
        load_pair(live_pair.drafter, live_pair.verifier, dtype="float32"),
        config,
        output_dir=tmp_path / "local",
        progress=False,
    )
    # never wrong: the samples equal the in-process ones for the same seeds, but where a coin lands between
    # the server's and the in-process row's thresholds (rows differ by up to about 3e-3 in logprob)
    same = sum(again[(r["problem_id"], r["repeat"])]["output"] == r["output"] for r in local.records)
    assert same >= 16, f"{same}/18 samples equal to in-process"


def test_a_server_that_never_becomes_ready_is_stopped_with_its_log(tmp_path):
    python = sglang_python()
    procs: list = []
    with pytest.raises(RuntimeError, match=r"(?s)did not become ready within 4 s; its last log lines"):
        with launch([ServerSpec(str(tmp_path), free_port())], python=python, timeout=4, device="cpu", processes=procs):
            pass
    assert procs and not procs[0].alive()  # nothing of it is left running


def test_a_server_that_dies_is_reported_with_its_last_log_lines(tmp_path):
    python = sglang_python()
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match=r"(?s)exited with code \d+ before it was ready; its last log lines.*\S"):
        with launch([ServerSpec(str(tmp_path / "empty"), free_port())], python=python, timeout=900, device="cpu"):
            pass


def test_a_wrong_port_or_another_model_is_refused_by_name(live_pair):
    d_url, v_url = live_pair.urls
    with pytest.raises(
        SGLangError,
        match=rf"drafter server at {v_url} serves '{live_pair.verifier}' .* not "
        rf"'{live_pair.drafter}' as --drafter names it",
    ):
        load_backend(live_pair.drafter, live_pair.verifier, drafter_url=v_url, verifier_url=d_url)
    with pytest.raises(SGLangError, match=rf"drafter server at {d_url} serves '{live_pair.drafter}'"):
        load_backend(live_pair.verifier, live_pair.verifier, drafter_url=d_url, verifier_url=v_url)
    with pytest.raises(SGLangError, match=r"verifier server at http://127.0.0.1:\d+ is unreachable"):
        load_backend(
            live_pair.drafter, live_pair.verifier, drafter_url=d_url, verifier_url=f"http://127.0.0.1:{free_port()}"
        )
    backend = load_backend(live_pair.drafter, live_pair.verifier, drafter_url=d_url, verifier_url=v_url)
    assert backend.name == f"sglang-{live_pair.drafter}->{live_pair.verifier}"
    backend.close()
