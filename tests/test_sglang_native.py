"""sglang_threshold on SGLang's own speculative server: telemetry of every key
generation, zero-round responses, impossible counters, the server's live point,
seeds, and the tuner against a stand-in."""

import threading
import time

import httpx
import pytest

from relaxtune.backends.sglang import SGLangBackend, SGLangError
from relaxtune.backends.sglang_native import DETERMINISTIC, TELEMETRY_KEYS, native_flags, parse_spec_telemetry
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.engine.sequence import generate
from relaxtune.testing.sglang_standin import SGLANG_DEFAULTS, StandInServer, StandInSpecServer
from relaxtune.tune.evaluation import evaluate
from relaxtune.tune.point_records import DecodeConfig

from .test_evaluation import tiny_task

SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.95)


@pytest.mark.parametrize("keys", TELEMETRY_KEYS)
def test_every_known_key_generation_is_read(keys):
    meta = {"spec_verify_ct": 7, keys[0]: 12, keys[1]: 28, "completion_tokens": 19}
    tel = parse_spec_telemetry(meta, n_draft=4)
    assert (tel.rounds, tel.accepted, tel.proposed, tel.keys) == (7, 12, 28, keys)


@pytest.mark.parametrize(
    "meta, tokens",
    [
        ({"completion_tokens": 1}, None),
        ({"completion_tokens": 0}, None),
        ({"finish_reason": {"type": "stop", "matched": 2}}, 1),
        ({"spec_verify_ct": 0, "completion_tokens": 1}, None),
    ],
)
def test_a_response_without_a_verify_round_is_a_valid_sample(meta, tokens):
    # SGLang 0.5.23 writes no spec_* key at all when spec_verify_ct is 0
    tel = parse_spec_telemetry(meta, n_draft=4, tokens=tokens)
    assert (tel.rounds, tel.accepted, tel.proposed) == (0, 0, 0)


@pytest.mark.parametrize(
    "meta, match",
    [
        ({"completion_tokens": 5}, "spec_verify_ct' missing from a response of 5 tokens .* is the server speculative"),
        ({"completion_tokens": 1, "spec_accept_rate": 0.5}, "spec_verify_ct' missing"),  # a partial rename
        (
            {"spec_verify_ct": 3, "spec_accept_len": 1.5},
            r"no known .* \(known: spec_num_correct_drafts.*got \['spec_accept_len",
        ),
        ({"spec_verify_ct": 3, "spec_num_correct_drafts": 5, "spec_num_proposed_drafts": 4}, "impossible"),
        (
            {"spec_verify_ct": 2, "spec_num_correct_drafts": 9, "spec_num_proposed_drafts": 12},
            r"above rounds x N = 2 x 4; refused, not clamped",
        ),
        ({"spec_verify_ct": -1, "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0}, "negative"),
        ({"spec_verify_ct": 3, "spec_accept_token_num": -2, "spec_draft_token_num": 12}, "impossible"),
        ({"spec_verify_ct": "x", "spec_num_correct_drafts": 1, "spec_num_proposed_drafts": 4}, "non-integer"),
    ],
)
def test_unreadable_or_impossible_telemetry_fails_loudly(meta, match):
    with pytest.raises(SGLangError, match=match):
        parse_spec_telemetry(meta, "speculative server at http://x", n_draft=4)


@pytest.fixture
def native(tiny_backend):
    started = []

    def start(threshold=0.5, n_draft=3, keys=TELEMETRY_KEYS[0], deterministic=True):
        d = StandInServer(tiny_backend.drafter).start()
        v = StandInServer(tiny_backend.verifier).start()
        s = StandInSpecServer(
            tiny_backend.drafter, tiny_backend.verifier, threshold, n_draft, keys, deterministic=deterministic
        ).start()
        started.extend([d, v, s])
        backend = SGLangBackend(
            d.url,
            v.url,
            tiny_backend.tokenizer,
            vocab_size=64,
            top_logprobs=64,
            backoff=0.01,
            retries=1,
            native_url=s.url,
        )
        return backend, s

    yield start
    for s in started:
        s.stop()


@pytest.mark.parametrize("keys", [TELEMETRY_KEYS[0], TELEMETRY_KEYS[2]])
def test_native_generation_reads_the_servers_counters(native, tiny_backend, keys):
    backend, server = native(keys=keys)
    prompt = tiny_backend.tokenizer.encode("def f(x): return x")
    out = generate(
        backend, prompt, method="sglang_threshold", knob=0.5, n_draft=3, sampling=SAMPLED, max_new_tokens=20, seed=4
    )
    again = server.answer(server.payloads[-1])  # deterministic: the same seed gives the same response
    meta = again["meta_info"]
    s = out.stats
    assert out.token_ids == again["output_ids"] and len(out.token_ids) == s.response_tokens == 20
    assert (s.rounds, s.accepted, s.drafted) == (meta["spec_verify_ct"], meta[keys[0]], meta[keys[1]])
    assert s.rounds > 0 and s.drafted == 3 * s.rounds and 0 <= s.accepted <= s.drafted
    assert s.emitted == s.rounds + s.accepted + 1 >= s.response_tokens  # the prefill's token and the rounds'
    assert out.extra["telemetry_keys"] == list(keys)
    sent = server.payloads[-1]["sampling_params"]
    assert (sent["temperature"], sent["top_k"], sent["top_p"], sent["sampling_seed"]) == (0.8, 20, 0.95, 4)
    assert set(SGLANG_DEFAULTS) <= set(sent)  # every parameter explicit: no server default applies


def test_explicit_parameters_leave_no_room_for_preferred_sampling_params(tiny_backend):
    prompt = tiny_backend.tokenizer.encode("def f(x): return x")
    outputs = []
    for preferred in (None, {"temperature": 0.05, "top_k": 1, "max_new_tokens": 2}):
        server = StandInSpecServer(
            tiny_backend.drafter, tiny_backend.verifier, 0.5, 3, preferred_sampling_params=preferred
        ).start()
        backend = SGLangBackend(server.url, server.url, tiny_backend.tokenizer, vocab_size=64, native_url=server.url)
        outputs.append(
            generate(
                backend,
                prompt,
                method="sglang_threshold",
                knob=0.5,
                n_draft=3,
                sampling=SAMPLED,
                max_new_tokens=12,
                seed=5,
            ).token_ids
        )
        backend.close()
        server.stop()
    assert outputs[0] == outputs[1] and len(outputs[0]) == 12
    bare = {"input_ids": prompt, "sampling_params": {"sampling_seed": 5}}  # what a server default would decide
    assert len(server.answer(bare)["output_ids"]) == 2


def test_zero_round_responses_are_samples_not_failures(native, tiny_backend, tmp_path):
    backend, server = native()
    prompt = tiny_backend.tokenizer.encode("abc")
    one = generate(
        backend, prompt, method="sglang_threshold", knob=0.5, n_draft=3, sampling=SAMPLED, max_new_tokens=1, seed=2
    )
    assert len(one.token_ids) == 1 and (one.stats.rounds, one.stats.accepted, one.stats.drafted) == (0, 0, 0)
    assert one.stats.emitted == 1 and one.stats.finish_reason == "length"
    assert not any(k.startswith("spec_") for k in server.answer(server.payloads[-1])["meta_info"])
    server.pair.eos_token_ids = frozenset(range(64))  # every first token is EOS: no verify round anywhere
    result = evaluate(
        tiny_task(), backend, DecodeConfig("sglang_threshold", 0.5, 3), output_dir=tmp_path, limit=3, progress=False
    )
    assert result.failed == 0 and result.n == 3
    assert all(
        r["stats"]["rounds"] == 0 and r["response_tokens"] == 1 and r["finish_reason"] == "stop" for r in result.records
    )


def test_a_point_the_server_does_not_serve_names_the_flags(native, tiny_backend):
    backend, _ = native(threshold=0.5, n_draft=3)
    prompt = tiny_backend.tokenizer.encode("abc")
    with pytest.raises(SGLangError, match="serves sglang_threshold at threshold 0.5, N 3, not 0.3, 3: relaunch") as err:
        generate(backend, prompt, method="sglang_threshold", knob=0.3, n_draft=3, sampling=SAMPLED, max_new_tokens=4)
    assert " ".join(native_flags(0.3, 3)) in str(err.value)
    assert native_flags(0.3, 3)[-5:] == [
        "--speculative-accept-threshold-single",
        "0.3",
        "--speculative-accept-threshold-acc",
        "0.3",
        DETERMINISTIC,
    ]


def _set(server, **values):
    return httpx.post(f"{server.url}/set_internal_state", json={"server_args": values}).json()


def test_live_thresholds_are_read_not_the_launch_flags(native, tiny_backend):
    backend, server = native(threshold=0.5, n_draft=3)
    assert backend.native.point() == (0.5, 3)
    assert _set(server, speculative_accept_threshold_single=0.3, speculative_accept_threshold_acc=0.3) == [True]
    info = httpx.get(f"{server.url}/server_info").json()
    assert info["speculative_accept_threshold_acc"] == 0.5  # the launch flag stays at the top level
    assert backend.native.point() == (0.3, 3)
    prompt = tiny_backend.tokenizer.encode("abc")
    with pytest.raises(SGLangError, match="serves sglang_threshold at threshold 0.3, N 3, not 0.5, 3"):
        generate(backend, prompt, method="sglang_threshold", knob=0.5, n_draft=3, sampling=SAMPLED, max_new_tokens=4)
    out = generate(backend, prompt, method="sglang_threshold", knob=0.3, n_draft=3, sampling=SAMPLED, max_new_tokens=6)
    assert len(out.token_ids) == 6
    assert _set(server, speculative_num_steps=5) == [False]  # not updatable at run time
    _set(server, speculative_accept_threshold_single=0.8)
    with pytest.raises(SGLangError, match="threshold_single 0.8 != threshold_acc 0.3"):
        backend.native.point()


def test_thresholds_changed_during_a_request_discard_the_sample(native, tiny_backend):
    backend, server = native(threshold=0.5, n_draft=3)
    server.delay = 0.6
    timer = threading.Timer(
        0.3, _set, (server,), dict(speculative_accept_threshold_single=0.2, speculative_accept_threshold_acc=0.2)
    )
    timer.start()
    with pytest.raises(SGLangError, match="thresholds changed during the request"):
        generate(
            backend,
            tiny_backend.tokenizer.encode("abc"),
            method="sglang_threshold",
            knob=0.5,
            n_draft=3,
            sampling=SAMPLED,
            max_new_tokens=4,
        )
    timer.join()


def test_seeds_count_only_under_deterministic_inference(native, tiny_backend):
    backend, server = native(deterministic=False)
    with pytest.raises(SGLangError, match=f"ignores sampling_seed .* relaunch it with .*{DETERMINISTIC}"):
        backend.native.point()
    payload = {
        "input_ids": tiny_backend.tokenizer.encode("abc"),
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 12, "sampling_seed": 7},
    }
    outputs = {tuple(server.answer(payload)["output_ids"]) for _ in range(6)}
    assert len(outputs) > 1  # the stand-in, like SGLang, ignores the seed
    server.launch["enable_deterministic_inference"] = True
    assert len({tuple(server.answer(payload)["output_ids"]) for _ in range(3)}) == 1


@pytest.mark.parametrize(
    "info, match",
    [
        ({"speculative_algorithm": "STANDALONE"}, "no internal_states"),
        ({"internal_states": [{"speculative_algorithm": None}]}, "not a chain speculative server"),
        (
            {
                "internal_states": [
                    {
                        "speculative_algorithm": "STANDALONE",
                        "speculative_eagle_topk": 1,
                        "speculative_num_draft_tokens": 4,
                    }
                ]
            },
            "lacks speculative_accept_threshold_single",
        ),
    ],
)
def test_server_info_without_live_values_is_refused(native, info, match):
    backend, server = native()
    server.server_info = lambda: info
    with pytest.raises(SGLangError, match=match):
        backend.native.point()


def test_ranks_that_disagree_are_refused(native):
    backend, server = native()
    real = server.server_info()
    rank = dict(
        real["internal_states"][0], speculative_accept_threshold_acc=0.1, speculative_accept_threshold_single=0.1
    )
    server.server_info = lambda: {**real, "internal_states": real["internal_states"] + [rank]}
    with pytest.raises(SGLangError, match="data-parallel ranks run different speculative settings"):
        backend.native.point()


def test_a_new_key_rename_is_a_failed_sample_not_a_wrong_one(native, tmp_path):
    backend, _ = native(keys=("spec_good_drafts", "spec_all_drafts"))
    result = evaluate(
        tiny_task(), backend, DecodeConfig("sglang_threshold", 0.5, 3), output_dir=tmp_path, limit=2, progress=False
    )
    assert result.failed == 2 and result.n == 0
    assert all("no known accepted/proposed draft counters" in r["error"] for r in result.records)


def test_tuner_pins_the_servers_point(native, tmp_path):
    from relaxtune.job.run import run_tune_job
    from relaxtune.tune.tuning import TuneSettings

    from .tiny_task import write_tiny_task

    backend, server = native(threshold=0.5, n_draft=3)
    settings = TuneSettings(
        task=write_tiny_task(tmp_path),
        methods=["sglang_threshold"],
        n_drafts=[2, 3],
        trials=3,
        limit=4,
        c_rel=0.3,
        output_dir=str(tmp_path / "runs"),
        stage_size=4,
        confirm="seeds",
    )
    config, _ = run_tune_job(settings, backend, progress=False, track=False, log=lambda m: None)
    result = config.methods["sglang_threshold"]
    assert result.trials == 1  # the launch flags fix (t, N): one point, one trial
    assert len(server.payloads) == 4  # one request per problem
    assert result.failed == 0 and result.study_name.endswith("_t0.5-n3")
    if result.feasible:
        assert (result.knob, result.n_draft) == (0.5, 3)
    else:
        assert (result.closest["knob"], result.closest["n_draft"]) == (0.5, 3)


def test_native_and_client_loop_samples_are_kept_apart(native, tiny_backend, tmp_path):
    backend, server = native(threshold=0.5, n_draft=3)
    plain = SGLangBackend(
        backend.drafter.url, backend.verifier.url, tiny_backend.tokenizer, vocab_size=64, top_logprobs=64
    )
    config = DecodeConfig("sglang_threshold", 0.5, 3)
    emulated = evaluate(tiny_task(), plain, config, output_dir=tmp_path, limit=2, progress=False)
    native_result = evaluate(tiny_task(), backend, config, output_dir=tmp_path, limit=2, progress=False)
    assert native_result.path != emulated.path and len(server.payloads) == 2  # the native server was asked
    plain.close()


def test_a_pinned_trial_that_fails_once_is_run_again(native, tmp_path):
    from relaxtune.job.run import run_tune_job
    from relaxtune.tune.tuning import TuneSettings

    from .tiny_task import write_tiny_task

    backend, server = native(threshold=0.5, n_draft=3)
    blips = []

    def flaky(spec, backend, config, **kw):
        if config.method == "sglang_threshold" and not blips:
            blips.append(1)
            raise RuntimeError("server blip")
        return evaluate(spec, backend, config, **kw)

    settings = TuneSettings(
        task=write_tiny_task(tmp_path),
        methods=["sglang_threshold"],
        n_drafts=[3],
        trials=3,
        limit=2,
        c_rel=0.3,
        output_dir=str(tmp_path / "runs"),
        stage_size=2,
        confirm="seeds",
    )
    config, _ = run_tune_job(settings, backend, evaluate_fn=flaky, progress=False, track=False, log=lambda m: None)
    result = config.methods["sglang_threshold"]
    assert blips and result.failed == 1 and result.trials == 1


def test_closing_the_client_fails_callers_instead_of_hanging(native, tiny_backend):
    backend, server = native()
    server.delay = 1.0
    errors = []

    def call():
        try:
            backend.native.server.generate({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})
        except SGLangError as err:
            errors.append(str(err))

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.3)
    backend.close()
    caller.join(10)
    assert not caller.is_alive() and "closed during the request" in errors[0]
    with pytest.raises(SGLangError, match="closed"):
        backend.verifier.health()
    backend.close()  # idempotent
