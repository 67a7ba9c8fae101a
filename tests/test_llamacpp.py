"""The llama.cpp backend on tiny random GGUF files written here: its logits agree with
themselves however they are batched and rolled back, strict stays lossless (chi-square
against the verifier's own joint, one sequence at a time and batched), a response does
not depend on its batch, and models it cannot load are refused by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'relaxtune[llamacpp]')")
pytest.importorskip("gguf", reason="the gguf package writes the tiny GGUF models (pip install 'relaxtune[llamacpp]')")

from relaxtune.backends.llamacpp import LlamaCppBackend, load_gguf_pair
from relaxtune.backends.llamacpp_model import LlamaModel
from relaxtune.backends.naming import gguf_pair_name
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.engine.batch import Request, generate_batch
from relaxtune.engine.sequence import generate

from .clocks import SquareClock, timed
from .conftest import P_FLOOR, chi2_pvalue
from .test_batch import EOS, LENGTHS
from .tiny_gguf import write_tiny_gguf
from .tiny_models import VOCAB, tiny_tokenizer

SAMPLING = SamplingParams(temperature=0.8)
SIX = list("abcdef")  # the chi-square pair's vocabulary: 36 cells for two tokens


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Two tiny pairs: 64 tokens (the tests' tokenizer) and 6 tokens (chi-square)."""
    root = tmp_path_factory.mktemp("gguf")
    kw64 = dict(vocab=VOCAB, control=3, eos=0, out_scale=3.0)
    kw6 = dict(vocab=SIX, seed=3, out_scale=2.0)
    return {
        "v64": write_tiny_gguf(root / "v64.gguf", **kw64),
        "d64": write_tiny_gguf(root / "d64.gguf", noise=0.4, **kw64),
        "v6": write_tiny_gguf(root / "v6.gguf", **kw6),
        "d6": write_tiny_gguf(root / "d6.gguf", noise=0.8, **kw6),
    }


def _pair(files, key: str, slots: int = 8, eos=frozenset()) -> LlamaCppBackend:
    tok = tiny_tokenizer() if key == "64" else None
    backend = LlamaCppBackend(
        LlamaModel(files["d" + key], slots, 256, threads=1),
        LlamaModel(files["v" + key], slots, 256, threads=1),
        tok,
        name=f"tiny-{key}",
    )
    backend.eos_token_ids = frozenset(eos)
    return backend


def test_scoring_equals_one_step_at_a_time_and_rollback_equals_recomputation(files):
    backend = _pair(files, "64")
    prompt, drafts = [5, 9, 14, 3, 22], [7, 7, 30, 12]
    a = backend.start(prompt)
    rows = backend.score(a, drafts)  # [5, V] in one decode
    b = backend.start(prompt)
    for i, t in enumerate(drafts):
        torch.testing.assert_close(backend.step(b), rows[i], atol=1e-4, rtol=1e-4)
        backend.commit(b, [t])
    torch.testing.assert_close(backend.step(b), rows[-1], atol=1e-4, rtol=1e-4)
    # a rejected draft: the cache rolls back and the next rows equal a fresh sequence's
    backend.commit(a, [7, 40])  # accepted 7, then 40 instead of the second draft
    assert a.extra["v_fed"] == prompt + [7]
    fresh = backend.start(prompt + [7, 40])
    torch.testing.assert_close(backend.score(a, [1, 2]), backend.score(fresh, [1, 2]), atol=1e-4, rtol=1e-4)


def test_a_batched_decode_equals_one_sequence_at_a_time(files):
    model = LlamaModel(files["v64"], 4, 256, threads=1)
    feeds = [(2, 0, [1, 2, 3, 4, 5], 2), (0, 0, [9, 8], 1), (3, 0, list(range(10, 40)), 3)]
    together = model.decode(feeds)
    for slot, *_ in feeds:
        model.release(slot)
    alone = torch.cat([model.decode([f]) for f in feeds])
    assert together.shape == (6, len(VOCAB))
    torch.testing.assert_close(together, alone, atol=1e-4, rtol=1e-4)
    # a feed longer than n_batch is split into several decodes with the same result
    small = LlamaModel(files["v64"], 1, 256, threads=1, n_batch=8)
    torch.testing.assert_close(small.decode([(0, 0, list(range(10, 40)), 3)]), alone[-3:], atol=1e-4, rtol=1e-4)


def _requests() -> list[Request]:
    out = []
    for i, n in enumerate(LENGTHS):
        prompt = [3 + (7 * i + 3 * j) % 61 for j in range(n)]
        stop = ("1", "e") if i % 3 == 0 else ()
        out.append(Request(prompt, seed=100 + i, max_new_tokens=18 + 3 * i, stop=stop, key=i))
    return out


def _view(g):
    s = g.stats
    return (
        g.token_ids,
        g.text,
        s.finish_reason,
        s.rounds,
        s.drafted,
        s.accepted,
        s.emitted,
        s.discarded,
        s.response_tokens,
        s.draft_forwards,
        s.verify_forwards,
    )


@pytest.mark.parametrize("method, knob", [("strict", None), ("r_fuzzy", 0.3), ("ar", None)])
def test_a_response_does_not_depend_on_its_batch(files, method, knob):
    """Ragged acceptance, rollback and refill: batches of 1 and 8 give every response
    token for token as one sequence at a time, under the same seeds."""
    backend = _pair(files, "64", eos={EOS})
    kw = dict(method=method, knob=knob, n_draft=3, sampling=SAMPLING)
    requests = _requests()
    alone = {
        r.key: generate(backend, r.prompt_ids, max_new_tokens=r.max_new_tokens, seed=r.seed, stop=r.stop, **kw)
        for r in requests
    }
    for size in (1, 8):
        got = {r.key: g for r, g in generate_batch(backend, requests, batch_size=size, **kw)}
        assert not [g for g in got.values() if isinstance(g, Exception)]
        assert {k: _view(g) for k, g in got.items()} == {k: _view(g) for k, g in alone.items()}, size
    assert sorted(backend.verifier.free) == list(range(8))  # every row gave its slots back
    ends = list(alone.values())
    assert any(g.stats.finish_reason == "stop" for g in ends) and any(g.stats.finish_reason == "length" for g in ends)
    if method != "ar":  # the batch saw ragged acceptance: some rounds accepted all, some none
        rounds = [(g.stats.accepted, g.stats.rounds) for g in ends]
        assert any(a == 0 for a, r in rounds) or any(a < 3 * r for a, r in rounds)
        assert any(a > 0 for a, _ in rounds)


def _ar_joint(model: LlamaModel, prompt: list[int], v: int) -> torch.Tensor:
    """The verifier's own joint of the first two tokens ``[v * v]`` (step by step)."""
    slot = model.acquire()
    p1 = model.decode([(slot, 0, prompt, 1)])[0].softmax(-1)
    rows = []
    for a in range(v):
        model.rollback(slot, len(prompt))
        rows.append(model.decode([(slot, len(prompt), [a], 1)])[0].softmax(-1))
    model.release(slot)
    return (p1[:, None] * torch.stack(rows)).reshape(-1)


@pytest.mark.slow
def test_strict_is_lossless(files):
    """The first two tokens of strict responses follow the verifier's own joint
    (chi-square, fixed seeds), one sequence at a time and batched with a prompt of
    another length; the drafter's joint is rejected, so the test has power."""
    backend = _pair(files, "6", slots=16)
    v = len(SIX)
    prompts = {"short": [1, 2, 3], "long": [5, 0, 4, 4, 1, 2, 3, 5, 5]}
    joint = {k: _ar_joint(backend.verifier, p, v) for k, p in prompts.items()}
    q_joint = {k: _ar_joint(backend.drafter, p, v) for k, p in prompts.items()}
    codes = [
        generate(backend, prompts["short"], method="strict", n_draft=3, max_new_tokens=2, seed=s).token_ids
        for s in range(1500)
    ]
    codes = torch.tensor([a * v + b for a, b in codes])
    assert chi2_pvalue(codes, joint["short"]) > P_FLOOR
    assert chi2_pvalue(codes, q_joint["short"]) < 1e-6
    requests = [Request(prompts[k], seed=s, max_new_tokens=2, key=k) for s in range(1500) for k in prompts]
    batched: dict[str, list[int]] = {k: [] for k in prompts}
    for r, g in generate_batch(backend, requests, method="strict", n_draft=3, batch_size=16):
        batched[r.key].append(g.token_ids[0] * v + g.token_ids[1])
    for key in prompts:
        assert chi2_pvalue(torch.tensor(batched[key]), joint[key]) > P_FLOOR
        assert chi2_pvalue(torch.tensor(batched[key]), q_joint[key]) < 1e-6


def test_dropped_states_free_their_slots_and_a_full_context_says_so(files):
    backend = _pair(files, "64", slots=2)
    a, b = backend.start([1, 2]), backend.start([3])
    with pytest.raises(RuntimeError, match="all 2 sequence slots are in use"):
        backend.start([4])
    del a, b
    c = backend.start([4])
    assert c.extra["slots"] == {"v": 0, "d": 0}


def test_models_it_cannot_load_are_refused_by_name(files, tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ValueError, match="not-a-model.gguf"):
        LlamaModel(bad)
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_gguf_pair(None, str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="different vocabularies"):
        LlamaCppBackend(LlamaModel(files["d6"]), LlamaModel(files["v64"]))
    with pytest.raises(ValueError, match="batch_size must lie in"):
        LlamaCppBackend(None, LlamaModel(files["v64"], 2), batch_size=3)


def test_load_gguf_pair_reads_the_tokenizer_given(files):
    backend = load_gguf_pair(str(files["d64"]), str(files["v64"]), batch_size=2, tokenizer=tiny_tokenizer())
    assert backend.name == gguf_pair_name(str(files["d64"]), str(files["v64"])) and backend.name.endswith("@llamacpp")
    assert backend.eos_token_ids == frozenset({0}) and backend.batch_size == 2
    out = generate(backend, [1, 5, 6], method="strict", n_draft=3, max_new_tokens=8, seed=0)
    assert out.text == backend.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_cost_profile_prices_every_draft_length_at_least_one_step(files):
    backend = _pair(files, "64")
    serving = backend.cost_profile([5, 6, 7], [2, 4], min_passes=3, max_passes=4)
    assert serving.batch_sizes == [1]
    profile = serving.at(1)
    assert set(profile.t_verify) == {3, 5} and profile.t_ar > 0 and profile.t_draft > 0
    assert all(t >= profile.t_ar for t in profile.t_verify.values())
    assert "@" not in profile.source and "threads" in profile.source
    assert sorted(backend.verifier.free) == list(range(8))


def test_cost_profile_decodes_every_batch_size_in_one_interleaved_measurement(files):
    backend = _pair(files, "64")
    serving = backend.cost_profile([5, 6, 7], [2, 4], (8, 1, 4), min_passes=3, max_passes=4, clock=SquareClock())
    assert serving.batch_sizes == [1, 4, 8] and [p.batch_size for p in serving.profiles.values()] == [1, 4, 8]
    for i, b in enumerate((1, 4, 8)):  # shapes t_ar, t_draft, verify(3), verify(5) of each batch size, in one pass
        p = serving.at(b)
        assert (p.t_ar, p.t_draft, p.t_verify[3], p.t_verify[5]) == pytest.approx(
            [timed(m) for m in range(4 * i, 4 * i + 4)]
        )
        assert p.passes == 4 and f"batch {b}," in p.source and len(p.flags) == 1
    assert sorted(backend.verifier.free) == sorted(backend.drafter.free) == list(range(8))  # every slot back
    with pytest.raises(ValueError, match=r"batch size 9 .* hold 8 sequences \(n_seq_max, from --batch-size 8\)"):
        backend.cost_profile([5, 6, 7], [2], (1, 9))
    assert sorted(backend.verifier.free) == list(range(8))


def test_eval_and_generate_run_on_llamacpp(files, tiny_pair_dirs, tmp_path):
    """``--runtime llamacpp`` on the command line: eval gives the same records at batch
    1 and 3 under the pair's ``@llamacpp`` name; generate runs and reports its speed-up."""
    import json

    from typer.testing import CliRunner

    from relaxtune.cli import app
    from relaxtune.cli.options import settings_from

    from .tiny_task import write_tiny_task

    runner, task = CliRunner(), write_tiny_task(tmp_path)
    pair = [
        "--runtime",
        "llamacpp",
        "--drafter",
        str(files["d64"]),
        "--verifier",
        str(files["v64"]),
        "--tokenizer",
        tiny_pair_dirs[1],
    ]
    outputs = {}
    for size in ("1", "3"):
        out = runner.invoke(
            app,
            ["eval", "--task", task, "--limit", "4", *pair, "--batch-size", size, "--output-dir", str(tmp_path / size)],
            env={"COLUMNS": "200"},
        )
        assert out.exit_code == 0, out.output
        (records,) = (tmp_path / size).rglob("*.jsonl")
        assert "llamacpp" in str(records)
        rows = map(json.loads, records.read_text().splitlines())
        outputs[size] = sorted((r["problem_id"], r["output"]) for r in rows)
    assert outputs["1"] == outputs["3"] and len(outputs["3"]) == 4
    out = runner.invoke(
        app,
        [
            "generate",
            "abc",
            "--max-new-tokens",
            "12",
            "--method",
            "cactus",
            "--alpha",
            "1",
            "--temperature",
            "0.8",
            *pair,
        ],
        env={"COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    assert "decoding statistics" in out.output and "measured wall-clock speed-up over AR" in out.output
    settings = settings_from(None, {"task": "humaneval", "runtime": "llamacpp"})
    assert settings.backend["runtime"] == "llamacpp"
    with pytest.raises(Exception, match="runtime"):
        settings_from(None, {"task": "humaneval", "runtime": "vllm"})


def test_the_benchmark_rows_run_llamacpp_ar_beside_strict_and_a_relaxed_rule(files, capsys):
    from relaxtune.bench.llamacpp import llamacpp_table

    backend = _pair(files, "64", slots=2)
    prompts = [[3 + (5 * i + j) % 60 for j in range(4 + i)] for i in range(4)]
    figures = llamacpp_table(backend, prompts, [1, 2], n_draft=2, max_new=6, repeats=1)
    for b in (1, 2):
        assert figures[b]["l_tps"][0] > 0 and figures[b]["s_tps"][0] > 0 and figures[b]["r_tps"][0] > 0
        assert 0 <= figures[b]["s_l_accept"][0] <= 2
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip()[:1] in "12" and "|" in line]
    assert [int(r.split("|")[0]) for r in rows] == [1, 2] and "S/L" in out and "R/L" in out
    assert sorted(backend.verifier.free) == [0, 1]  # the AR runs gave their slots back


@pytest.mark.parametrize("method, knob", [("strict", None), ("ears", 0.3)])
def test_prompt_lookup_drafts_on_llamacpp(files, method, knob):
    """Prompt lookup over the llama.cpp verifier (``load_backend``): no drafter model is
    loaded, drafts cost no forward pass, batched equals one sequence token for token."""
    from relaxtune.backends.load import load_backend
    from relaxtune.backends.lookup import PromptLookupBackend

    backend = load_backend(
        "prompt-lookup", str(files["v64"]), runtime="llamacpp", batch_size=4, tokenizer=tiny_tokenizer()
    )
    assert isinstance(backend, PromptLookupBackend) and backend.inner.drafter is None and backend.batch_size == 4
    assert backend.name == f"prompt-lookup->{files['v64'].resolve()}@llamacpp"
    kw = dict(method=method, knob=knob, n_draft=4, sampling=SAMPLING)
    requests = [
        Request(
            [(5 * i + 3 * (j % (2 + i))) % 60 + 3 for j in range(6 + 5 * i)],
            seed=40 + i,
            max_new_tokens=20 + 4 * i,
            key=i,
        )
        for i in range(6)
    ]
    alone = {
        r.key: generate(backend, r.prompt_ids, max_new_tokens=r.max_new_tokens, seed=r.seed, **kw) for r in requests
    }
    got = {r.key: g for r, g in generate_batch(backend, requests, batch_size=4, **kw)}
    assert {k: _view(g) for k, g in got.items()} == {k: _view(g) for k, g in alone.items()}
    assert sum(g.stats.accepted for g in alone.values()) > 0
    assert all(g.stats.draft_forwards == 0 and g.stats.draft_seconds > 0 for g in alone.values())
    assert sorted(backend.inner.verifier.free) == list(range(4))


def test_strict_with_prompt_lookup_on_llamacpp_is_lossless(files):
    """The first two tokens of strict responses with lookup drafts follow the verifier's
    own joint (chi-square, fixed seeds); the prompt repeats, so drafts are proposed."""
    from relaxtune.backends.lookup import PromptLookupBackend

    verifier = LlamaModel(files["v6"], 16, 256, threads=1)
    backend = PromptLookupBackend(LlamaCppBackend(None, verifier, None, name="tiny-6"), max_ngram=2)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    joint = _ar_joint(verifier, prompt, len(SIX))
    requests = [Request(prompt, seed=s, max_new_tokens=2, key=s) for s in range(1500)]
    got = list(generate_batch(backend, requests, method="strict", n_draft=3, batch_size=16))
    codes = torch.tensor([g.token_ids[0] * len(SIX) + g.token_ids[1] for _, g in got])
    assert chi2_pvalue(codes, joint) > P_FLOOR
    assert sum(g.stats.accepted for _, g in got) > 100  # the lookup's drafts (3, then 1) were tested and taken


def test_extra_buffer_types_are_probed_once_and_a_crash_loads_without_them(files, tmp_path, monkeypatch):
    from relaxtune.backends import llamacpp_check, llamacpp_model

    monkeypatch.setenv("RELAXTUNE_CACHE", str(tmp_path / "cache"))
    assert llamacpp_check.extra_buffers_run(files["v64"]) == (True, "decoded")  # a real decode in a child process
    crash = tmp_path / "crash"  # an interpreter whose decode dies as the AMX one did (SIGSEGV)
    crash.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crash.chmod(0o755)
    assert llamacpp_check.extra_buffers_run(files["d64"], python=str(crash)) == (
        False,
        "its probe decode died by signal 11",
    )
    # kept per model content, build and CPU: asked again, the verdict is read, not probed
    assert llamacpp_check.extra_buffers_run(files["d64"]) == (False, "its probe decode died by signal 11")
    assert llamacpp_check.extra_buffers_run(files["v64"], python=str(crash)) == (True, "decoded")
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 30\n")
    hang.chmod(0o755)
    assert llamacpp_check.extra_buffers_run(files["v6"], python=str(hang), timeout=1) == (
        False,
        "its probe decode took over 1 s",
    )
    assert llamacpp_check.extra_buffers_run(files["v6"]) == (True, "decoded")  # a timeout is not kept
    # a model whose probe crashed loads without the extra buffer types, says so once, and decodes
    with pytest.warns(RuntimeWarning, match=r"extra buffer types .* crashed on this CPU .*d64\.gguf"):
        model = llamacpp_model.LlamaModel(files["d64"], 1, 64, threads=1)
    slot = model.acquire()
    assert model.decode([(slot, 0, [5, 9, 14], 1)]).shape == (1, model.n_vocab)


def test_llama_cpps_log_keeps_errors_and_drops_warnings(capfd):
    """llama-cpp-python's own callback reads an older ggml level enum and printed load-time warnings
    ("control-looking token") among the job's progress lines; ours keeps errors and their continuations."""
    from relaxtune.backends import llamacpp_model as lm

    for level, text in [
        (3, b"load: control-looking token: 128247 '</s>' was not control-type\n"),  # WARN
        (5, b"  continued warning\n"),
        (2, b"llama_model_loader: loaded meta data\n"),  # INFO
        (4, b"llama_decode: failed to decode\n"),  # ERROR
        (5, b"  ret = -1\n"),
        (1, b"debug\n"),
    ]:
        lm._errors_only(level, text, None)
    assert capfd.readouterr().err == "llama_decode: failed to decode\n  ret = -1\n"


def test_the_tokenizer_loads_beside_the_models_and_each_failure_is_named(files, tmp_path):
    # the GGUF's tokenizer is read on a thread of its own while llama.cpp loads the models
    # (load_gguf_pair); a tiny test GGUF holds no tokenizer: the error names the file and the flag
    with pytest.raises(ValueError, match=r"cannot read a tokenizer from .*v64.*give --tokenizer"):
        load_gguf_pair(str(files["d64"]), str(files["v64"]), batch_size=2)
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ValueError, match="llama.cpp cannot load .*not-a-model.gguf"):  # the model's error, first
        load_gguf_pair(None, str(bad), batch_size=2)
