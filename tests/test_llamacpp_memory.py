"""What the llama.cpp backend holds in memory: the weights read once (not mapped), KV
caches sized to the task (``context_cells``, ``fit_context``: its longest sequence and
the sequences it runs at once) and made at first use, the cost profile's batch in
contexts of its own, and glibc's freed heap returned (``release_free_memory``).
Tiny random GGUF files written here; the job's own sizing on the embedded pair is
in ``docs/getting-started/disk-and-cache.md`` (measured with ``scripts/peak_memory.py``)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'relaxtune[llamacpp]')")
pytest.importorskip("gguf", reason="the gguf package writes the tiny GGUF models (pip install 'relaxtune[llamacpp]')")

from relaxtune.backends.llamacpp import LlamaCppBackend, context_cells
from relaxtune.backends.llamacpp_model import LlamaModel, release_free_memory
from relaxtune.backends.lookup import PromptLookupBackend
from relaxtune.engine.batch import Request, generate_batch
from relaxtune.engine.sequence import generate
from relaxtune.job.steps import fit_contexts
from relaxtune.tasks.spec import Problem, SamplingParams, build_prompt_ids, load_task

from .tiny_gguf import write_tiny_gguf
from .tiny_models import VOCAB, tiny_tokenizer


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    kw = dict(vocab=VOCAB, control=3, eos=0, out_scale=3.0)
    return {"v": write_tiny_gguf(root / "v.gguf", **kw), "d": write_tiny_gguf(root / "d.gguf", noise=0.4, **kw)}


def _pair(files, slots: int = 4) -> LlamaCppBackend:
    backend = LlamaCppBackend(
        LlamaModel(files["d"], slots, threads=1), LlamaModel(files["v"], slots, threads=1), tiny_tokenizer()
    )
    backend.eos_token_ids = frozenset()  # every response runs to its budget
    return backend


def _mapped(path: Path) -> int:
    return sum(str(Path(path).resolve()) in line for line in Path("/proc/self/maps").read_text().splitlines())


def test_context_cells_is_the_longest_round_or_the_cost_profile():
    # generation: prompt + max_new_tokens - 1 committed tokens, then N drafts
    assert context_cells(300, 384, 4) == 687
    assert context_cells(300, 384, 0) == 683
    # the cost profile: prompt + 64 tokens + N + 1, larger under a small budget
    assert context_cells(300, 8, 4) == 369
    assert context_cells(0, 1, 0) == 65
    for bad in [(-1, 8, 4), (3, 0, 4), (3, 8, -1)]:
        with pytest.raises(ValueError, match="context_cells needs"):
            context_cells(*bad)


def test_the_weights_are_read_not_mapped_and_the_cache_is_made_at_first_use(files, capfd):
    model = LlamaModel(files["v"], 2, 300, threads=1)
    assert _mapped(files["v"]) == 0  # direct I/O: the GGUF's pages are not resident a second time
    assert model.ctx is None and model.n_ctx_seq == 300  # no KV cache yet
    slot = model.acquire()
    assert model.ctx is not None and model.n_ctx_seq == 512  # 300 rounded up to a multiple of 256, as llama.cpp would
    assert "rounding down" not in capfd.readouterr().err  # without llama.cpp's warning about it
    with pytest.raises(RuntimeError, match="while sequences hold slots"):
        model.resize(256)
    model.release(slot)
    model.resize(256)
    assert model.ctx is None and model.n_ctx_seq == 256
    with pytest.raises(ValueError, match="exceeds the 256 cells per sequence"):
        model.decode([(0, 250, [1] * 7, 1)])  # the context is made first: its cells are checked
    assert model.decode([(0, 0, [1] * 256, 1)]).shape == (1, len(VOCAB))
    with pytest.raises(ValueError, match="n_ctx_seq must be >= 1"):
        model.resize(0)


def test_a_fitted_context_holds_a_response_to_its_budget_and_the_cost_profile(files):
    backend = _pair(files)
    # 10 + 4 + (243 - 1) = 256 cells: exactly one padded block, so a bound one short would overflow
    assert backend.fit_context(10, 243, 4) == 256
    out = generate(backend, list(range(3, 13)), method="strict", n_draft=4, max_new_tokens=243, seed=1)
    assert len(out.token_ids) == 243 and out.stats.finish_reason == "length"
    assert backend.verifier.n_ctx_seq == backend.drafter.n_ctx_seq == 256
    # the profile's slots hold 187 + 64 tokens and decode N + 1 = 5 more: 256 cells again
    assert backend.fit_context(187, 1, 4) == 256
    profile = backend.cost_profile([3 + i % 60 for i in range(187)], [4], min_passes=3, max_passes=3)
    assert profile.at(1).t_ar > 0 and sorted(backend.verifier.free) == list(range(4))


def test_the_job_fits_the_contexts_to_its_longest_prompt(files):
    backend = _pair(files)
    spec = load_task("humaneval").model_copy(update={"max_new_tokens": 100})
    problems = [Problem("a", "x" * 5, None), Problem("b", "def f():\n    return 1\n" * 4, None)]
    longest = max(len(build_prompt_ids(backend.tokenizer, spec, p)) for p in problems)
    assert fit_contexts(backend, spec, problems, [2, 7]) == longest + 7 + 99
    assert backend.verifier.slots == backend.drafter.slots == 2  # 2 problems x 1 repeat at once
    fit_contexts(backend, spec, problems, [2, 7], lanes=3)  # 3 parallel trials: 6, at most the 4 slots loaded
    assert backend.verifier.slots == backend.drafter.slots == 4
    lookup = PromptLookupBackend(backend)
    assert fit_contexts(lookup, spec, problems[:1], [3]) == context_cells(
        len(build_prompt_ids(backend.tokenizer, spec, problems[0])), 100, 3
    )
    assert fit_contexts(object(), spec, problems, [3]) is None  # a backend that sizes its own


def _responses(backend, requests):
    kw = dict(method="r_fuzzy", knob=0.3, n_draft=3, sampling=SamplingParams(temperature=0.8), batch_size=4)
    return {r.key: (g.token_ids, g.stats.rounds, g.stats.accepted) for r, g in generate_batch(backend, requests, **kw)}


def test_contexts_fitted_to_the_sequences_run_at_once_give_the_same_responses_and_the_profile_its_own(files):
    requests = [
        Request([3 + (5 * i + j) % 60 for j in range(9 + i)], seed=7 + i, max_new_tokens=30, key=i) for i in (0, 1)
    ]
    every_slot, fitted = _pair(files), _pair(files)
    assert every_slot.fit_context(12, 30, 3) == fitted.fit_context(12, 30, 3, sequences=2) == 80
    assert (every_slot.verifier.slots, fitted.verifier.slots, fitted.drafter.slots) == (4, 2, 2)
    assert fitted.batch_size == 4  # what an evaluation asks for is unchanged: it runs 2 rows either way
    assert _responses(fitted, requests) == _responses(every_slot, requests)  # token for token, round for round
    cells = fitted.verifier.n_ctx_seq  # as llama.cpp padded the 80
    # the profile's batch of 4 in contexts of 4 slots of prompt + 64 + N + 1 = 20 + 64 + 5 cells, then freed
    serving = fitted.cost_profile(list(range(3, 23)), [4], (1, 4), min_passes=3, max_passes=3)
    assert serving.batch_sizes == [1, 4]
    for model in fitted.models.values():
        assert (model.ctx, model.slots, model.n_ctx_seq, sorted(model.free)) == (None, 2, cells, [0, 1])
    held = fitted.start([3, 4, 5])  # a sequence holds a slot: the profile measures in the contexts there are
    assert fitted.cost_profile([5, 6, 7], [2], (1,), min_passes=3, max_passes=3).batch_sizes == [1]
    assert fitted.verifier.ctx is not None and fitted.verifier.slots == 2 and fitted.verifier.free == [1]
    with pytest.raises(RuntimeError, match="all 2 sequence slots are in use"):
        fitted.start([3]), fitted.start([4])
    del held
    assert fitted.fit_context(12, 30, 3, sequences=9) == 80 and fitted.verifier.slots == 4  # at most those loaded
    with pytest.raises(ValueError, match="sequences must be >= 1"):
        fitted.fit_context(12, 30, 3, sequences=0)
    with pytest.raises(ValueError, match=r"slots must lie in \[1, 256\]"):
        fitted.verifier.resize(44, 0)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_the_freed_heap_is_returned_on_glibc():
    assert release_free_memory() is True
