"""The SGLang backend against a stand-in server with SGLang's layout, backed by tiny models."""

import json
import math
from pathlib import Path

import pytest
import torch

from relaxtune.backends.sglang import SGLangBackend, SGLangError, parse_next, parse_score
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.engine.sequence import generate
from relaxtune.testing.sglang_standin import StandInServer
from relaxtune.tune.evaluation import evaluate
from relaxtune.tune.point_records import DecodeConfig

from .conftest import P_FLOOR, chi2_pvalue
from .test_evaluation import tiny_task
from .tiny_models import noisy_copy, tiny_lm

GREEDY = SamplingParams(temperature=0.0)

# A /generate response in SGLang 0.5.23's layout (docs/reference/sglang-protocol.md),
# for prompt [5, 9, 7] + drafts [3, 4] scored with logprob_start_len = 2 (each row's probabilities sum to at
# most 1, as log-probabilities must: a row above 1 is refused).
LAYOUT = {
    "text": "",
    "output_ids": [2],
    "meta_info": {
        "cached_tokens": 2,
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "input_token_logprobs": [[None, 7, None], [-0.5, 3, None], [-3.0, 4, None]],
        "input_top_logprobs": [None, [[-0.5, 3, None], [-1.2, 1, None]], [[-0.3, 2, None], [-2.5, 0, None]]],
        "output_token_logprobs": [[-0.3, 2, None]],
        "output_top_logprobs": [[[-0.3, 2, None], [-1.8, 1, None]]],
    },
}


def test_parse_recorded_layout():
    rows, missing, cached = parse_score(LAYOUT, [3, 4], vocab=6)
    assert rows.shape == (3, 6) and cached == 2
    assert rows[0, 3] == -0.5 and rows[0, 1] == -1.2 and rows[0, 0] == -math.inf
    assert rows[1, 4] == -3.0  # the draft's exact logprob is added though outside the top-K
    assert rows[2, 2] == -0.3
    assert missing[0] == pytest.approx(1 - math.exp(-0.5) - math.exp(-1.2))
    row, _ = parse_next(LAYOUT, vocab=6)
    assert torch.equal(row, rows[2])


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: b["meta_info"].pop("input_top_logprobs"), "field 'meta_info.input_top_logprobs' missing"),
        (lambda b: b["meta_info"].pop("output_top_logprobs"), "output_top_logprobs"),
        (lambda b: b["meta_info"]["input_token_logprobs"].pop(), "expected 3 'input_token_logprobs' entries, got 2"),
        (lambda b: b["meta_info"]["input_token_logprobs"].__setitem__(1, [-0.5, 1, None]), "expected draft 3"),
        (lambda b: b["meta_info"]["input_top_logprobs"][1].append([-1.0, 99, None]), "outside the vocabulary"),
    ],
)
def test_malformed_responses_name_the_field(mutate, match):
    body = json.loads(json.dumps(LAYOUT))
    mutate(body)
    with pytest.raises(SGLangError, match=match):
        parse_score(body, [3, 4], vocab=6, server="verifier server at http://x")


@pytest.mark.parametrize(
    "value, match",
    [
        (0.0, r"probabilities sum to 2 \(at most 1\)"),
        (0.7, "impossible logprob 0.7"),
        (float("nan"), "impossible logprob nan"),
        (float("inf"), "impossible logprob inf"),
    ],
)
def test_rows_that_are_not_log_probabilities_are_refused(value, match):
    # a server whose top-K logprobs are all 0.0 (total probability K) or positive: refused, never renormalised
    body = json.loads(json.dumps(LAYOUT))
    for row in body["meta_info"]["input_top_logprobs"][1:] + body["meta_info"]["output_top_logprobs"]:
        for entry in row:
            entry[0] = value
    for entry in body["meta_info"]["input_token_logprobs"][1:]:
        entry[0] = min(value, 0.0) if value == value else value
    with pytest.raises(SGLangError, match=match):
        parse_score(body, [3, 4], vocab=6, server="verifier server at http://x")
    with pytest.raises(SGLangError, match=match):
        parse_next(body, vocab=6, server="drafter server at http://x")


def test_rows_within_float32_rounding_are_kept():
    body = json.loads(json.dumps(LAYOUT))
    body["meta_info"]["output_top_logprobs"] = [[[3e-5, 2, None], [-30.0, 1, None]]]  # rounding above 0
    row, missing = parse_next(body, vocab=6)
    assert row[2] == pytest.approx(3e-5) and missing == 0.0
    full = [[math.log(0.5), 0, None], [math.log(0.25), 1, None], [math.log(0.25) + 1e-4, 2, None]]  # sums to 1.000025
    body["meta_info"]["output_top_logprobs"] = [full]
    assert parse_next(body, vocab=6)[1] == 0.0


@pytest.fixture
def servers(tiny_backend):
    d = StandInServer(tiny_backend.drafter).start()
    v = StandInServer(tiny_backend.verifier).start()
    yield d, v
    for s in (d, v):
        try:
            s.stop()
        except OSError:
            pass


def sglang(servers, tokenizer, **kw):
    d, v = servers
    return SGLangBackend(d.url, v.url, tokenizer, vocab_size=64, top_logprobs=64, backoff=0.01, **kw)


@pytest.mark.parametrize("n_draft", [1, 4])
def test_greedy_strict_over_sglang_equals_in_process(servers, tiny_backend, n_draft):
    backend = sglang(servers, tiny_backend.tokenizer)
    prompt = tiny_backend.tokenizer.encode("def f(x): return x")
    remote = generate(backend, prompt, method="strict", n_draft=n_draft, sampling=GREEDY, max_new_tokens=24)
    local = generate(tiny_backend, prompt, method="strict", n_draft=n_draft, sampling=GREEDY, max_new_tokens=24)
    ar = generate(tiny_backend, prompt, method="ar", sampling=GREEDY, max_new_tokens=24)
    assert remote.token_ids == local.token_ids == ar.token_ids
    assert remote.stats.accepted == local.stats.accepted
    cached = remote.extra["cached_tokens"]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # the prefix cache is reused after the first round
    assert max(remote.extra["missing_mass"]) < 1e-4  # K = V: rows are complete


class Tok:
    """The little a tokenizer must do for generation."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


@pytest.mark.slow
def test_sampled_strict_over_sglang_follows_ar():
    v = 4
    verifier = tiny_lm(vocab=v, seed=5, scale=3.0)
    drafter = noisy_copy(verifier, 0.5)
    d, s = StandInServer(drafter).start(), StandInServer(verifier).start()
    try:
        backend = SGLangBackend(d.url, s.url, Tok(), vocab_size=v, top_logprobs=v)
        prompt = [1, 2, 3]
        with torch.inference_mode():
            p1 = verifier(input_ids=torch.tensor([prompt])).logits[0, -1].softmax(-1)
            p2 = verifier(input_ids=torch.tensor([prompt + [a] for a in range(v)])).logits[:, -1].softmax(-1)
        joint = (p1[:, None] * p2).reshape(-1)
        codes = []
        for seed in range(1200):
            out = generate(backend, prompt, method="strict", n_draft=2, max_new_tokens=2, seed=seed)
            codes.append(out.token_ids[0] * v + out.token_ids[1])
        assert chi2_pvalue(torch.tensor(codes), joint) > P_FLOOR
    finally:
        d.stop()
        s.stop()


def test_transient_faults_are_retried(servers, tiny_backend):
    d, v = servers
    backend = sglang(servers, tiny_backend.tokenizer)
    prompt = tiny_backend.tokenizer.encode("abc")
    clean = generate(backend, prompt, method="strict", n_draft=3, sampling=GREEDY, max_new_tokens=12)
    v.faults = ["500", "truncate", "drop"]
    d.faults = ["500"]
    faulty = generate(backend, prompt, method="strict", n_draft=3, sampling=GREEDY, max_new_tokens=12)
    assert faulty.token_ids == clean.token_ids and not v.faults and not d.faults


def test_server_down_mid_run_records_failures(servers, tiny_backend, tmp_path):
    d, v = servers
    backend = sglang(servers, tiny_backend.tokenizer, retries=1, max_concurrency=2)
    spec = tiny_task()
    first = evaluate(spec, backend, DecodeConfig("strict", None, 2), output_dir=tmp_path, limit=2, progress=False)
    assert first.n == 2 and first.failed == 0
    v.stop()
    result = evaluate(spec, backend, DecodeConfig("strict", None, 2), output_dir=tmp_path, limit=4, progress=False)
    assert result.n == 2 and result.failed == 2  # nothing lost, nothing counted as wrong
    failed = [r for r in result.records if r["failed"]]
    assert all("verifier server at" in r["error"] for r in failed)
    assert len(Path(result.path).read_text().splitlines()) == 4


@pytest.mark.parametrize(
    "side, fault, match",
    [("verifier", "zero-logprobs", "probabilities sum to"), ("drafter", "positive-logprobs", "impossible logprob 0.5")],
)
def test_a_server_returning_impossible_rows_fails_the_sample_never_grades_it(
    servers, tiny_backend, tmp_path, side, fault, match
):
    d, v = servers
    backend = sglang(servers, tiny_backend.tokenizer, retries=1, max_concurrency=1)
    (v if side == "verifier" else d).faults = [fault]  # the first request of that server
    result = evaluate(
        tiny_task(), backend, DecodeConfig("strict", None, 2), output_dir=tmp_path, limit=2, progress=False
    )
    assert result.failed == 1 and result.n == 1  # a failed sample, not a wrong answer
    failed = [r for r in result.records if r["failed"]]
    assert len(failed) == 1 and failed[0]["verdict"] == "generation_error"
    assert f"{side} server at" in failed[0]["error"] and match in failed[0]["error"]
    assert not v.faults and not d.faults


def test_unreachable_server_is_named(tiny_backend):
    with pytest.raises(SGLangError, match="drafter server at http://127.0.0.1:9 is unreachable"):
        SGLangBackend("http://127.0.0.1:9", "http://127.0.0.1:9", tiny_backend.tokenizer, vocab_size=64)


def test_tuner_runs_against_sglang(servers, tiny_backend, tmp_path):
    from relaxtune.job.run import run_tune_job
    from relaxtune.tune.tuning import TuneSettings

    from .tiny_task import write_tiny_task

    backend = sglang(servers, tiny_backend.tokenizer)
    settings = TuneSettings(
        task=write_tiny_task(tmp_path),
        methods=["cactus"],
        n_drafts=[2],
        trials=2,
        limit=4,
        c_rel=0.3,
        output_dir=str(tmp_path / "runs"),
        stage_size=4,
        confirm="seeds",
    )
    config, path = run_tune_job(settings, backend, progress=False, track=False, log=lambda m: None)
    assert config.methods["cactus"].trials == 2 and path.exists()


@pytest.mark.slow  # about 6-11 s: the default run stays under 8 minutes on 2 cores
def test_a_job_through_sglang_measures_its_serving_profile_through_the_servers(servers, tiny_backend, tmp_path):
    """A job through SGLang servers was priced with a fixed c_rel of 0.2: it measures its costs through them now,
    at the batch sizes of the device the verifier server reports (a CPU's here: 1, 4, 16)."""
    from relaxtune.backends.sglang_costs import server_batch_sizes
    from relaxtune.decoding.serving import ServingProfile
    from relaxtune.job.run import run_tune_job
    from relaxtune.tune.serving_sizes import auto_batch_sizes
    from relaxtune.tune.setting_groups import PairSettings
    from relaxtune.tune.tuning import TuneSettings

    from .tiny_task import write_tiny_task

    d, v = servers
    assert auto_batch_sizes(PairSettings(drafter_url=d.url, verifier_url=v.url), "hf") == [1, 4, 16]
    v.launch["device"] = "cuda"
    assert server_batch_sizes(v.url) == (1, 8, 32, 128)
    assert server_batch_sizes("http://127.0.0.1:9", timeout=1) == (1, 8, 32, 128)  # no answer: SGLang's default
    backend = sglang(servers, tiny_backend.tokenizer)
    settings = TuneSettings(
        task=write_tiny_task(tmp_path),
        methods=["cactus"],
        n_drafts=[2],
        trials=1,
        limit=4,
        serving_batch_sizes=[1, 2],
        output_dir=str(tmp_path / "runs"),
        stage_size=4,
        confirm="seeds",
    )
    config, _ = run_tune_job(settings, backend, progress=False, track=False, log=lambda m: None)
    profile = ServingProfile.from_dict(config.cost_profile)
    assert profile.batch_sizes == [1, 2] == config.serving_batch_sizes and set(profile.at(2).t_verify) == {3}
    assert all("concurrent HTTP" in p.source for p in profile.profiles.values())
    assert config.c_rel == pytest.approx(float(f"{profile.c_rel:.4g}"))


def test_requests_in_flight_are_bounded_by_max_concurrency(servers, tiny_backend):
    from concurrent.futures import ThreadPoolExecutor

    d, v = servers
    backend = sglang(servers, tiny_backend.tokenizer, max_concurrency=2)
    v.delay = 0.2
    prompt = tiny_backend.tokenizer.encode("abc")
    with ThreadPoolExecutor(6) as pool:
        rows = list(pool.map(lambda _: backend.step(backend.start(prompt)), range(6)))
    assert v.peak_in_flight == 2 and v.requests == 6  # six callers, never more than two requests at once
    assert all(torch.equal(r, rows[0]) for r in rows)
    backend.close()
    assert not backend.http.thread.is_alive()


def test_a_draft_at_vocab_size_minus_one_is_read_back_from_id_zero():
    body = json.loads(json.dumps(LAYOUT))
    body["meta_info"]["input_token_logprobs"][2] = [-3.0, 0, None]  # SGLang 0.5.23 reports draft 5 = V - 1 as 0
    rows, _, _ = parse_score(body, [3, 5], vocab=6)
    assert rows[1, 5] == -3.0 and rows[1, 0] == -2.5  # the draft's logprob at its own id; id 0 keeps its own
    with pytest.raises(SGLangError, match=r"input_token_logprobs\[2\] is for token 0, expected draft 4"):
        parse_score(body, [3, 4], vocab=6)  # below V - 1 an id 0 is a real mismatch


def test_asked_ids_join_the_rows_and_must_be_there():
    body = json.loads(json.dumps(LAYOUT))
    body["meta_info"]["input_token_ids_logprobs"] = [
        None,
        [[-4.0, 5, None], [-0.5, 3, None]],
        [[-6.0, 5, None], [-2.5, 3, None]],
    ]
    body["meta_info"]["output_token_ids_logprobs"] = [[[-7.0, 5, None], [-3.0, 3, None]]]
    rows, missing, _ = parse_score(body, [3, 4], vocab=6, asked=True)
    assert rows[:, 5].tolist() == [-4.0, -6.0, -7.0] and rows[1, 3] == -2.5 and rows[2, 3] == -3.0
    assert missing[0] == pytest.approx(1 - math.exp(-0.5) - math.exp(-1.2) - math.exp(-4.0))
    del body["meta_info"]["output_token_ids_logprobs"]
    with pytest.raises(SGLangError, match="field 'meta_info.output_token_ids_logprobs' missing"):
        parse_score(body, [3, 4], vocab=6, asked=True)


@pytest.mark.parametrize("asked_ids", [None, 64])
def test_scoring_is_exact_on_the_drafter_ids_asked_for(servers, tiny_backend, asked_ids):
    d, v = servers  # K = 4 << V: most of each row is unknown
    backend = SGLangBackend(d.url, v.url, tiny_backend.tokenizer, vocab_size=64, top_logprobs=4, asked_ids=asked_ids)
    prompt = tiny_backend.tokenizer.encode("def f(x): return x")
    state = backend.start(prompt)
    drafted = backend.draft(state, 3, lambda z: int(z.argmax()), extra_step=True)
    rows = backend.score(state, drafted.ids)
    with torch.inference_mode():
        truth = tiny_backend.verifier(input_ids=torch.tensor([prompt + drafted.ids])).logits[0, -4:].log_softmax(-1)
    held = torch.isfinite(drafted.logits).any(0).nonzero().squeeze(-1).tolist()
    by_rank = drafted.logits.topk(4, dim=-1).indices.T.reshape(-1).tolist()  # every row's best first
    expected = sorted(held) if asked_ids == 64 else sorted(list(dict.fromkeys(by_rank))[:4])
    asked = v.payloads[-1]["token_ids_logprob"]
    assert asked == expected and 4 < len(held) <= 16
    assert set(drafted.logits.argmax(-1).tolist()) <= set(asked)  # each row's top K // (N + 1) = 1 at least
    for j in range(4):
        known = torch.isfinite(rows[j])
        assert bool(known[asked].all()) and int(known.sum()) <= 4 + len(asked) + 1
        assert torch.allclose(rows[j][known], truth[j][known], atol=1e-5)
    assert max(state.extra["missing_mass"]) > 0.0  # recorded, not hidden
    backend.step(backend.start(prompt))  # an AR step asks for nothing
    assert "token_ids_logprob" not in v.payloads[-1]


def test_a_draft_and_a_prompt_token_at_vocab_size_minus_one_score_normally(servers, tiny_backend):
    backend = sglang(servers, tiny_backend.tokenizer)
    prompt = tiny_backend.tokenizer.encode("abc") + [63]  # the boundary token is V - 1 too
    state = backend.start(prompt)
    rows = backend.score(state, [5, 63, 63])
    with torch.inference_mode():
        truth = tiny_backend.verifier(input_ids=torch.tensor([prompt + [5, 63, 63]])).logits[0, -4:].log_softmax(-1)
    assert torch.allclose(rows, truth, atol=1e-5)


@pytest.mark.parametrize(
    "method, knob",
    [
        ("strict", None),
        ("ens", 0.2),
        ("mentored", 0.7),
        ("cactus", 1.0),
        ("r_fuzzy", 0.3),
        ("spec_casc_opt", 0.05),
        ("spec_casc_tok", 0.8),
        ("spec_cont_dec", 1.0),
        ("sglang_threshold", 0.5),
        ("always_accept", None),
    ],
)
def test_every_method_runs_on_top_k_rows(servers, tiny_backend, method, knob):
    backend = sglang(servers, tiny_backend.tokenizer)
    backend.top_logprobs = 6  # no top-k cut in the sampling: rows are truncated, the missing mass recorded
    prompt = tiny_backend.tokenizer.encode("def f(x):")
    out = generate(
        backend,
        prompt,
        method=method,
        knob=knob,
        n_draft=3,
        sampling=SamplingParams(temperature=1.0),
        max_new_tokens=10,
        seed=3,
    )
    assert 1 <= len(out.token_ids) <= 10 and all(0 <= t < 64 for t in out.token_ids)
    assert 0.0 < max(out.extra["missing_mass"]) < 1.0


def test_stop_tokens_are_the_union_sglang_stops_on(tiny_pair_dirs, tmp_path, servers, tiny_backend):
    import shutil

    from relaxtune.backends.sglang import stop_token_ids

    path = tmp_path / "verifier"
    shutil.copytree(tiny_pair_dirs[1], path)
    prompt = tiny_backend.tokenizer.encode("def f(x): return x")
    greedy = generate(tiny_backend, prompt, method="ar", sampling=GREEDY, max_new_tokens=12).token_ids
    stop_at = next(i for i in range(2, 12) if greedy[i] not in greedy[:i])  # a first occurrence
    for name, key, value in (
        ("config.json", "eos_token_id", 3),
        ("generation_config.json", "eos_token_id", [0, greedy[stop_at]]),
    ):
        cfg = json.loads((path / name).read_text())
        cfg[key] = value
        (path / name).write_text(json.dumps(cfg))
    backend = sglang(servers, str(path))
    assert backend.eos_token_ids == {0, 3, greedy[stop_at]}
    out = generate(backend, prompt, method="strict", n_draft=3, sampling=GREEDY, max_new_tokens=12)
    assert out.token_ids == greedy[: stop_at + 1] and out.stats.finish_reason == "stop"

    class Qwen:  # the tokenizer's EOS and SGLang's extra turn-final markers join too
        eos_token_id = 151645

        def get_added_vocab(self):
            return {"<|im_end|>": 151645, "<|endoftext|>": 151643, "<|eom_id|>": 151650}

    generation = type("G", (), {"eos_token_id": [151645, 151643]})()
    assert stop_token_ids(Qwen(), None, generation) == {151643, 151645, 151650}


def test_max_new_tokens_zero_keeps_the_bonus_row_as_the_live_server_does(tiny_backend):
    """Seen on a live SGLang 0.5.23 server (tests/test_sglang_live.py checks it there):
    max_new_tokens = 0 keeps output_top_logprobs (the bonus row), not as sglang-protocol.md says."""
    server = StandInServer(tiny_backend.verifier)
    payload = {
        "input_ids": [5, 9, 7, 3],
        "return_logprob": True,
        "logprob_start_len": 2,
        "top_logprobs_num": 64,
        "token_ids_logprob": [1, 63],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
    }
    one = server.answer(payload)
    zero = server.answer({**payload, "sampling_params": {"max_new_tokens": 0, "temperature": 0}})
    meta = zero["meta_info"]
    assert zero["output_ids"] == [] and meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert len(meta["output_top_logprobs"]) == len(meta["output_token_ids_logprobs"]) == 1
    assert torch.equal(parse_score(zero, [3], 64, asked=True)[0], parse_score(one, [3], 64, asked=True)[0])
