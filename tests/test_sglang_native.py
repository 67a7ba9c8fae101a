"""sglang_threshold on SGLang's own speculative server: telemetry of every key
generation, the server's pinned point, and the tuner against a stand-in."""

import pytest

from relaxtune.backends.sglang import SGLangBackend, SGLangError
from relaxtune.backends.sglang_native import TELEMETRY_KEYS, native_flags, parse_spec_telemetry
from relaxtune.engine import generate
from relaxtune.evaluation import DecodeConfig, evaluate
from relaxtune.sampling import SamplingParams
from relaxtune.testing.sglang_standin import StandInServer, StandInSpecServer

from .test_evaluation import tiny_task

SAMPLED = SamplingParams(temperature=0.8, top_k=20, top_p=0.95)


@pytest.mark.parametrize("keys", TELEMETRY_KEYS)
def test_every_known_key_generation_is_read(keys):
    meta = {"spec_verify_ct": 7, keys[0]: 12, keys[1]: 28, "completion_tokens": 19}
    tel = parse_spec_telemetry(meta)
    assert (tel.rounds, tel.accepted, tel.proposed, tel.keys) == (7, 12, 28, keys)


@pytest.mark.parametrize(
    "meta, match",
    [
        ({"completion_tokens": 5}, "spec_verify_ct' missing: is the server speculative"),
        ({"spec_verify_ct": 3, "spec_accept_len": 1.5}, r"no known .* \(known: spec_num_correct_drafts.*got \['spec_accept_len"),
        ({"spec_verify_ct": 3, "spec_num_correct_drafts": 5, "spec_num_proposed_drafts": 4}, "inconsistent"),
        ({"spec_verify_ct": "x", "spec_num_correct_drafts": 1, "spec_num_proposed_drafts": 4}, "non-integer"),
    ],
)
def test_unreadable_telemetry_fails_loudly(meta, match):
    with pytest.raises(SGLangError, match=match):
        parse_spec_telemetry(meta, "speculative server at http://x")


@pytest.fixture
def native(tiny_backend):
    started = []

    def start(threshold=0.5, n_draft=3, keys=TELEMETRY_KEYS[0]):
        d = StandInServer(tiny_backend.drafter).start()
        v = StandInServer(tiny_backend.verifier).start()
        s = StandInSpecServer(tiny_backend.drafter, tiny_backend.verifier, threshold, n_draft, keys).start()
        started.extend([d, v, s])
        backend = SGLangBackend(d.url, v.url, tiny_backend.tokenizer, vocab_size=64, top_logprobs=64, backoff=0.01,
                                retries=1, native_url=s.url)
        return backend, s

    yield start
    for s in started:
        s.stop()


@pytest.mark.parametrize("keys", [TELEMETRY_KEYS[0], TELEMETRY_KEYS[2]])
def test_native_generation_reads_the_servers_counters(native, tiny_backend, keys):
    backend, server = native(keys=keys)
    prompt = tiny_backend.tokenizer.encode("def f(x): return x")
    remote = generate(backend, prompt, method="sglang_threshold", knob=0.5, n_draft=3, sampling=SAMPLED,
                      max_new_tokens=20, seed=4)
    local = generate(tiny_backend, prompt, method="sglang_threshold", knob=0.5, n_draft=3, sampling=SAMPLED,
                     max_new_tokens=20, seed=4)
    assert remote.token_ids == local.token_ids and len(remote.token_ids) == 20
    s = remote.stats
    assert (s.rounds, s.accepted, s.drafted) == (local.stats.rounds, local.stats.accepted, local.stats.drafted)
    assert s.drafted == 3 * s.rounds and 0 <= s.accepted <= s.drafted
    assert remote.extra["telemetry_keys"] == list(keys)
    sent = server.payloads[-1]["sampling_params"]
    assert (sent["temperature"], sent["top_k"], sent["top_p"], sent["sampling_seed"]) == (0.8, 20, 0.95, 4)


def test_a_point_the_server_does_not_serve_names_the_flags(native, tiny_backend):
    backend, _ = native(threshold=0.5, n_draft=3)
    prompt = tiny_backend.tokenizer.encode("abc")
    with pytest.raises(SGLangError, match="serves sglang_threshold at threshold 0.5, N 3, not 0.3, 3: relaunch") as err:
        generate(backend, prompt, method="sglang_threshold", knob=0.3, n_draft=3, sampling=SAMPLED, max_new_tokens=4)
    assert " ".join(native_flags(0.3, 3)) in str(err.value)
    assert native_flags(0.3, 3)[-4:] == ["--speculative-accept-threshold-single", "0.3",
                                         "--speculative-accept-threshold-acc", "0.3"]


def test_a_new_key_rename_is_a_failed_sample_not_a_wrong_one(native, tmp_path):
    backend, _ = native(keys=("spec_good_drafts", "spec_all_drafts"))
    result = evaluate(tiny_task(), backend, DecodeConfig("sglang_threshold", 0.5, 3), output_dir=tmp_path, limit=2,
                      progress=False)
    assert result.failed == 2 and result.n == 0
    assert all("no known accepted/proposed draft counters" in r["error"] for r in result.records)


def test_tuner_pins_the_servers_point(native, tmp_path):
    from relaxtune.job import run_tune_job
    from relaxtune.tuning import TuneSettings

    from .tiny_task import write_tiny_task

    backend, server = native(threshold=0.5, n_draft=3)
    settings = TuneSettings(task=write_tiny_task(tmp_path), methods=["sglang_threshold"], n_drafts=[2, 3], trials=3,
                            limit=4, c_rel=0.3, output_dir=str(tmp_path / "runs"), stage_size=4)
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
    plain = SGLangBackend(backend.drafter.url, backend.verifier.url, tiny_backend.tokenizer, vocab_size=64,
                          top_logprobs=64)
    config = DecodeConfig("sglang_threshold", 0.5, 3)
    emulated = evaluate(tiny_task(), plain, config, output_dir=tmp_path, limit=2, progress=False)
    native_result = evaluate(tiny_task(), backend, config, output_dir=tmp_path, limit=2, progress=False)
    assert native_result.path != emulated.path and len(server.payloads) == 2  # the native server was asked
    plain.close()


def test_a_pinned_trial_that_fails_once_is_run_again(native, tmp_path):
    from relaxtune.job import run_tune_job
    from relaxtune.tuning import TuneSettings

    from .tiny_task import write_tiny_task

    backend, server = native(threshold=0.5, n_draft=3)
    blips = []

    def flaky(spec, backend, config, **kw):
        if config.method == "sglang_threshold" and not blips:
            blips.append(1)
            raise RuntimeError("server blip")
        return evaluate(spec, backend, config, **kw)

    settings = TuneSettings(task=write_tiny_task(tmp_path), methods=["sglang_threshold"], n_drafts=[3], trials=3,
                            limit=2, c_rel=0.3, output_dir=str(tmp_path / "runs"), stage_size=2)
    config, _ = run_tune_job(settings, backend, evaluate_fn=flaky, progress=False, track=False, log=lambda m: None)
    result = config.methods["sglang_threshold"]
    assert blips and result.failed == 1 and result.trials == 1


def test_closing_the_client_fails_callers_instead_of_hanging(native, tiny_backend):
    import threading

    backend, server = native()
    server.delay = 1.0
    errors = []

    def call():
        try:
            backend.native.server.generate({"input_ids": [1, 2], "sampling_params": {}})
        except SGLangError as err:
            errors.append(str(err))

    caller = threading.Thread(target=call)
    caller.start()
    import time

    time.sleep(0.3)
    backend.close()
    caller.join(10)
    assert not caller.is_alive() and "closed during the request" in errors[0]
    with pytest.raises(SGLangError, match="closed"):
        backend.verifier.health()
    backend.close()  # idempotent
