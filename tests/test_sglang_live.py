"""relaxtune's SGLang backend against real SGLang 0.5.23 servers on this CPU (``live_sglang``).

Two servers (a tiny random Qwen2 drafter and verifier, saved by the session fixture
``live_pair``) answer every request shape the backend sends; each answer is checked
against the same models run in process (float32). The drafting and verification coins
are relaxtune's own (the servers only return raw logprobs), so fixed seeds give the
same samples through the servers as in process.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from relaxtune.backends.hf import load_pair
from relaxtune.backends.sglang import GREEDY_ONE, SGLangBackend, SGLangError, parse_next, parse_score
from relaxtune.backends.sglang_models import model_info, serves
from relaxtune.backends.sglang_native import parse_point
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.engine.sequence import generate

from .conftest import P_FLOOR, chi2_pvalue

pytestmark = pytest.mark.live_sglang
V = 64
ATOL = 1e-2  # float32 in both places, different kernels: rows differ by up to about 3e-3 (measured)


@pytest.fixture(scope="module")
def local(live_pair):
    return load_pair(live_pair.drafter, live_pair.verifier, dtype="float32")


@pytest.fixture
def remote(live_pair):
    backend = SGLangBackend(*live_pair.urls, live_pair.verifier, top_logprobs=V, backoff=0.2, max_concurrency=4)
    yield backend
    backend.close()


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)


def _payload(ids, start, **extra) -> dict:
    return {
        "input_ids": ids,
        "sampling_params": dict(GREEDY_ONE),
        "return_logprob": True,
        "logprob_start_len": start,
        "top_logprobs_num": V,
        **extra,
    }


def _post(url: str, payload) -> dict | list:
    r = httpx.post(f"{url}/generate", json=payload, timeout=120)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def _prompt(local, text="def f(x): return x") -> list[int]:
    return local.tokenizer.encode(text)


def test_scoring_rows_equal_the_verifier_in_process_with_asked_ids_stops_and_the_last_id(live_pair, local, remote):
    prompt = _prompt(local)
    drafts = [5, V - 1, 0, 7, V - 1]  # the last id (reported as 0 by SGLang) and the stop token 0 among the drafts
    state = remote.start(prompt)
    state.extra["drafter_ids"] = [1, 2, 3, V - 1]  # token_ids_logprob
    rows = remote.score(state, drafts)
    want = _logprobs(local.verifier, prompt + drafts)[len(prompt) - 1 :]
    assert rows.shape == (len(drafts) + 1, V)
    torch.testing.assert_close(rows, want, atol=ATOL, rtol=0)
    assert max(state.extra["missing_mass"]) < 1e-4  # K = V: complete rows
    assert remote.eos_token_ids == frozenset({0})  # the saved tokenizer's and configs' EOS


def test_drafting_rows_equal_the_drafter_in_process(local, remote):
    prompt = _prompt(local, "abc")
    state = remote.start(prompt)
    out = remote.draft(state, 3, pick=lambda row: int(row.argmax()), extra_step=True)
    seq = prompt + out.ids
    want = _logprobs(local.drafter, seq)[len(prompt) - 1 :]
    assert out.logits.shape == (4, V) and state.draft_forwards == 4
    torch.testing.assert_close(out.logits.log_softmax(-1), want, atol=ATOL, rtol=0)
    assert len(state.extra["drafter_ids"]) == V  # K ids of the drafter's rows, kept for the next score


def test_max_new_tokens_zero_still_returns_the_bonus_row(live_pair, local):
    """sglang-protocol.md says max_new_tokens = 0 drops output_top_logprobs; SGLang 0.5.23 keeps it."""
    prompt = _prompt(local)
    one = _post(live_pair.urls[1], _payload(prompt, len(prompt) - 1))
    zero = _post(
        live_pair.urls[1], _payload(prompt, len(prompt) - 1, sampling_params={**GREEDY_ONE, "max_new_tokens": 0})
    )
    assert zero["meta_info"]["output_token_logprobs"] == [] and len(zero["meta_info"]["output_top_logprobs"]) == 1
    torch.testing.assert_close(parse_next(zero, V)[0], parse_next(one, V)[0], atol=ATOL, rtol=0)


def test_a_batch_list_returns_one_body_per_item_equal_to_single_requests(live_pair, local):
    a, b = _prompt(local, "xy"), _prompt(local, "hello world")
    asked_ids = [[1, 2], [V - 1, 2]]
    items = [
        _payload(a + [3, 4], len(a) - 1, token_ids_logprob=asked_ids[0]),
        _payload(b + [9], len(b) - 1, token_ids_logprob=asked_ids[1]),
    ]
    payload = {
        "input_ids": [a + [3, 4], b + [9]],
        "sampling_params": [dict(GREEDY_ONE)] * 2,
        "return_logprob": True,
        "logprob_start_len": [len(a) - 1, len(b) - 1],
        "top_logprobs_num": [V, V],
        "token_ids_logprob": asked_ids,
    }
    refused = httpx.post(
        f"{live_pair.urls[1]}/generate", json={**payload, "token_ids_logprob": [None, [2]]}, timeout=120
    )
    assert refused.status_code == 400  # per item, a list for every item: null is refused
    batch = _post(live_pair.urls[1], payload)
    assert isinstance(batch, list) and len(batch) == 2
    for body, single, drafts, asked in zip(batch, items, ([3, 4], [9]), (True, True)):
        got = parse_score(body, drafts, V, asked=asked)[0]
        want = parse_score(_post(live_pair.urls[1], single), drafts, V, asked=asked)[0]
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_a_long_prompt_is_scored_whole_and_its_prefix_cached(live_pair, local, remote):
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, V, (3000,), generator=g).tolist()
    state = remote.start(prompt)
    rows = remote.score(state, [4, 5])
    want = _logprobs(local.verifier, prompt + [4, 5])[len(prompt) - 1 :]
    torch.testing.assert_close(rows, want, atol=ATOL, rtol=0)
    remote.commit(state, [4, 5, int(rows[2].argmax())])
    remote.score(state, [6])  # the next round: everything before the new start is cached
    assert state.extra["cached_tokens"][-1] == len(state.tokens) - 1


def test_server_info_and_model_info_parse(live_pair):
    info = httpx.get(f"{live_pair.urls[1]}/server_info", timeout=30).json()
    assert info["model_path"] == live_pair.verifier and info["device"] == "cpu"
    state = info["internal_states"][0]
    assert state["speculative_accept_threshold_single"] == state["speculative_accept_threshold_acc"] == 1.0
    assert {"memory_usage", "last_gen_throughput"} <= set(state)
    with pytest.raises(SGLangError, match="is not a chain speculative server"):
        parse_point(info, "verifier")  # a plain server is no native speculative point
    backend = SGLangBackend(*live_pair.urls, live_pair.verifier, check=False)
    try:
        got = model_info(backend.verifier)
        assert got["model_path"] == live_pair.verifier and serves(live_pair.verifier, got)
        assert not serves(live_pair.drafter, got)
        old = httpx.get(f"{live_pair.urls[0]}/get_model_info", timeout=30).json()  # the deprecated alias
        assert old["model_path"] == live_pair.drafter
    finally:
        backend.close()


@pytest.mark.parametrize("method, knob", [("cactus", 1.0), ("mentored", 0.5)])
def test_relaxed_rules_through_the_servers_accept_as_in_process(local, remote, method, knob):
    """Same seeds, rows equal to float tolerance: the same samples but for a coin that lands
    between two rows' thresholds, and the same acceptance rate; four sequences in flight."""
    prompts = [_prompt(local, t) for t in ("a", "def g(", "12+3=", "x = [1, 2")]
    sampling = SamplingParams(temperature=1.0)

    def run(backend, i):
        return generate(
            backend,
            prompts[i % 4],
            method=method,
            knob=knob,
            n_draft=3,
            sampling=sampling,
            max_new_tokens=12,
            seed=100 + i,
        )

    with ThreadPoolExecutor(4) as pool:
        far = list(pool.map(lambda i: run(remote, i), range(12)))
    near = [run(local, i) for i in range(12)]
    same = sum(a.token_ids == b.token_ids for a, b in zip(far, near))
    assert same >= 10, f"{same}/12 samples equal"
    rate = [sum(g.stats.accepted for g in gs) / sum(g.stats.drafted for g in gs) for gs in (far, near)]
    assert abs(rate[0] - rate[1]) <= 0.05 and rate[0] > 0, rate


def test_strict_through_the_servers_samples_the_verifiers_distribution(local, live_pair):
    remote = SGLangBackend(*live_pair.urls, live_pair.verifier, top_logprobs=V, max_concurrency=8)
    prompt = _prompt(local, "q")
    p = _logprobs(local.verifier, prompt)[-1].exp()

    def first(seed):
        return generate(remote, prompt, method="strict", n_draft=1, max_new_tokens=1, seed=seed).token_ids[0]

    with ThreadPoolExecutor(8) as pool:
        tokens = list(pool.map(first, range(400)))
    remote.close()
    assert chi2_pvalue(torch.tensor(tokens), p) > P_FLOOR
    assert float(p.max()) < 0.9  # a distribution worth testing


def test_the_prefect_flow_tunes_through_the_servers(live_pair, tmp_path):
    """The main job as a Prefect flow (Prefect's test harness), its pair served by SGLang."""
    import yaml
    from prefect.testing.utilities import prefect_test_harness

    from relaxtune.flows.tune import tune_task

    from .tiny_task import write_tiny_task

    d_url, v_url = live_pair.urls
    settings = {
        "drafter": live_pair.drafter,
        "verifier": live_pair.verifier,
        "drafter_url": d_url,
        "verifier_url": v_url,
        "c_rel": 0.3,
        "stage_size": 2,
        "output_dir": str(tmp_path / "runs"),
        "mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "storage": f"sqlite:///{tmp_path / 'optuna.db'}",
    }
    with prefect_test_harness(server_startup_timeout=180):
        result = tune_task(
            task=write_tiny_task(tmp_path, max_new_tokens=8),
            methods=["cactus"],
            limit=2,
            trials=1,
            n_drafts=[2],
            settings=settings,
        )
    assert result["methods"]["cactus"]["trials"] == 1
    tuned = yaml.safe_load((tmp_path / "runs" / "tiny_math.tuned.yaml").read_text())
    assert tuned["task"] == "tiny_math"
    records = list((tmp_path / "runs").rglob("*.jsonl"))
    assert records and all("sglang-" in str(r) for r in records)
    assert all(not rec.get("failed") for r in records for rec in map(yaml.safe_load, r.read_text().splitlines()))
