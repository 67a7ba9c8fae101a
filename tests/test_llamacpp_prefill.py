"""A prompt prefilled once on llama.cpp: a slot's cache copied to another
(``LlamaModel.copy``) scores as if it had been prefilled itself; rows of one prompt
joining together (the repeats of a problem) and the cost profile's B slots prefill it
once and copy it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'relaxtune[llamacpp]')")
pytest.importorskip("gguf", reason="the gguf package writes the tiny GGUF models (pip install 'relaxtune[llamacpp]')")

from relaxtune.backends.llamacpp import LlamaCppBackend
from relaxtune.backends.llamacpp_model import LlamaModel

from .tiny_gguf import write_tiny_gguf
from .tiny_models import VOCAB, tiny_tokenizer

PROMPT = [3 + (7 * j) % 61 for j in range(40)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    kw = dict(vocab=VOCAB, control=3, eos=0, out_scale=3.0)
    return {"v": write_tiny_gguf(root / "v.gguf", **kw), "d": write_tiny_gguf(root / "d.gguf", noise=0.4, **kw)}


def _spy(model: LlamaModel) -> list[list[int]]:
    """Each decode's feed lengths, in order (the model's own decode still runs)."""
    seen, decode = [], model.decode
    model.decode = lambda feeds: seen.append([len(f[2]) for f in feeds]) or decode(feeds)
    return seen


def test_a_copied_cache_scores_as_its_own_prefill(files):
    model = LlamaModel(files["v"], 4, 128, threads=1)
    own = [model.acquire() for _ in range(4)]
    model.decode([(s, 0, PROMPT, 1) for s in own])
    prefilled = model.decode([(s, len(PROMPT), [5, 9, 14], 3) for s in own])
    for s in own:
        model.release(s)
    slots = [model.acquire() for _ in range(4)]
    model.decode([(slots[0], 0, PROMPT, 1)])
    for s in slots[1:]:
        model.copy(slots[0], s)
    copied = model.decode([(s, len(PROMPT), [5, 9, 14], 3) for s in slots])
    assert copied.shape == (12, len(VOCAB))
    torch.testing.assert_close(copied, prefilled, atol=1e-5, rtol=1e-5)
    model.rollback(slots[1], len(PROMPT))  # a copy rolls back on its own: the source keeps its tokens
    torch.testing.assert_close(model.decode([(slots[1], len(PROMPT), [5], 1)]), prefilled[3:4], atol=1e-5, rtol=1e-5)


def test_the_repeats_of_a_prompt_prefill_once_and_score_as_if_each_had(files):
    def backend() -> LlamaCppBackend:
        return LlamaCppBackend(
            LlamaModel(files["d"], 4, 128, threads=1), LlamaModel(files["v"], 4, 128, threads=1), tiny_tokenizer()
        )

    shared, apart = backend(), backend()
    seen = _spy(shared.verifier)
    other = PROMPT[:20]
    batch = shared.start_batch()
    rows = shared.join(batch, [PROMPT, other, PROMPT, PROMPT])
    assert seen == [[len(PROMPT) - 1, len(other) - 1]]  # one decode, each prompt once
    assert [r.verify_tokens_fed for r in rows] == [len(PROMPT) - 1, len(other) - 1, len(PROMPT) - 1, len(PROMPT) - 1]
    alone = apart.start_batch()
    apart.join(alone, [PROMPT])
    apart.join(alone, [other])
    apart.join(alone, [PROMPT])
    apart.join(alone, [PROMPT])
    drafts = torch.tensor([[5, 9], [7, 7], [30, 12], [1, 2]])
    torch.testing.assert_close(
        shared.score_batch(batch, drafts), apart.score_batch(alone, drafts), atol=1e-5, rtol=1e-5
    )
    assert sum(r.prefill_seconds for r in rows) > 0 and len({r.prefill_seconds for r in rows}) == 1


def test_the_cost_profile_prefills_one_slot_and_copies_it(files):
    backend = LlamaCppBackend(
        LlamaModel(files["d"], 4, 128, threads=1), LlamaModel(files["v"], 4, 128, threads=1), tiny_tokenizer()
    )
    verify, draft = _spy(backend.verifier), _spy(backend.drafter)
    serving = backend.cost_profile(PROMPT, [2], (1, 4), min_passes=2, max_passes=2)
    assert serving.batch_sizes == [1, 4]
    assert verify[0] == draft[0] == [len(PROMPT) + 64]  # the prompt plus 64 tokens, in one slot
    assert {len(feeds) for feeds in verify[1:]} == {1, 4}  # then the timed forwards over 1 and 4 slots
    assert sorted(backend.verifier.free) == sorted(backend.drafter.free) == list(range(4))
