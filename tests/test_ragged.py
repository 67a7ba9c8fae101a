"""The ragged batch cache: every row's logits equal a forward over its sequence alone,
through joins, leaves, ragged feeds, rollbacks, cropping and compaction."""

import random

import pytest
import torch

from relaxtune.backends.ragged import PrefillStore, RaggedCache, supports

from .tiny_models import tiny_lm


def _alone(model, seq: list[int], k: int) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([seq])).logits[0, -k:]


@pytest.mark.parametrize("compact_every", [0, 3], ids=["holes", "compacted"])
def test_rows_see_only_their_own_sequence(compact_every):
    model = tiny_lm(vocab=64, seed=3, scale=3.0)
    assert supports(model)
    cache = RaggedCache(model, "cpu")
    rng = random.Random(compact_every)
    seqs = [[rng.randrange(64) for _ in range(n)] for n in (1, 7, 20)]  # a one-token prompt has nothing to prefill
    cache.join([s[:-1] for s in seqs])
    lacking = [[s[-1]] for s in seqs]
    worst, ragged_feeds = 0.0, 0
    for step in range(24):
        if step == 6:  # a long prompt joins a running batch (the batch is left-padded to it)
            seqs.append([rng.randrange(64) for _ in range(45)])
            cache.join([seqs[-1][:-1]])
            lacking.append(seqs[-1][-1:])
        if step == 12:  # a row leaves; a short one joins (it is left-padded to the batch)
            cache.leave([1])
            del seqs[1], lacking[1]
            seqs.append([rng.randrange(64) for _ in range(2)])
            cache.join([seqs[-1][:-1]])
            lacking.append(seqs[-1][-1:])
        n = rng.randrange(1, 5)
        feeds = [lack + [rng.randrange(64) for _ in range(n)] for lack in lacking]
        ragged_feeds += len({len(f) for f in feeds}) > 1
        keep = min(map(len, feeds))
        out = cache.forward(feeds, keep)
        for b, seq in enumerate(seqs):
            seen = seq[: len(seq) - len(lacking[b])] + feeds[b]
            worst = max(worst, float((out[b] - _alone(model, seen, keep)).abs().max()))
        for b in range(len(seqs)):  # accept a random number of the fed drafts, then a new token
            accepted = rng.randrange(0, n + 1)
            base = len(seqs[b]) - len(lacking[b])
            seqs[b] = seqs[b][:base] + feeds[b][: len(lacking[b]) + accepted] + [rng.randrange(64)]
            held = len(seqs[b]) - 1 - (rng.random() < 0.3 and accepted > 0)  # some rows lack two tokens
            cache.rollback(b, held)
            lacking[b] = seqs[b][held:]
        cache.tidy()
        assert cache.width - max(map(len, cache.cols)) <= 0.5 * cache.width  # never twice the longest row
        if compact_every and step % compact_every == 0:
            cache.compact()
            assert bool(cache.valid.all(1).any()) or cache.rows == 0  # the longest row has no holes left
        assert [f for f in cache.fed] == [s[: len(s) - len(lack)] for s, lack in zip(seqs, lacking)]
        assert cache.valid.sum(1).tolist() == [len(f) for f in cache.fed]
    assert worst < 1e-5
    assert ragged_feeds > 0  # rows lacking one or two tokens met in one forward


def test_holes_are_cropped_and_compacted():
    model = tiny_lm(vocab=64, seed=3)
    cache = RaggedCache(model, "cpu")
    cache.join([[1, 2, 3], [4, 5, 6, 7, 8]])
    cache.forward([[9, 1, 1, 1], [9, 2, 2, 2]], 4)
    width = cache.width
    cache.rollback(0, 4)  # both rows drop their last three drafts: those columns are holes in every row
    cache.rollback(1, 6)
    cache.tidy()
    assert cache.width == width - 3
    cache.leave([1])  # the long row leaves: the short row's left padding is cropped
    assert cache.width == 4 and cache.valid.all()
    cache.forward([[3, 3]], 2)
    cache.rollback(0, 4)  # row 0 drops the two it was fed: trailing holes are cropped
    cache.tidy()
    assert cache.width == 4 and cache.fed == [[1, 2, 3, 9]]


def test_holes_in_every_row_are_compacted_away():
    model = tiny_lm(vocab=64, seed=3)
    cache = RaggedCache(model, "cpu")
    cache.join([[1], [2], [3]])
    widths = []
    for step in range(9):  # each round one row keeps all five fed tokens, the others one: holes everywhere
        cache.forward([[5, 6, 7, 8, 9]] * 3, 1)
        for r in range(3):
            cache.rollback(r, len(cache.fed[r]) - (0 if r == step % 3 else 4))
        cache.tidy()
        widths.append(cache.width)
    assert max(widths) < 1 + 9 * 5 and min(widths[3:]) < max(widths)  # compacted at least once
    with torch.inference_mode():  # the compacted rows still see exactly their own tokens
        out = cache.forward([[1]] * 3, 1)
        for r in range(3):
            ref = model(input_ids=torch.tensor([cache.fed[r]])).logits[0, -1]  # its tokens, then the 1 fed
            assert torch.allclose(out[r, 0], ref, atol=1e-5)


def test_bad_feeds_are_refused():
    cache = RaggedCache(tiny_lm(vocab=64), "cpu")
    cache.join([[1, 2], [3]])
    with pytest.raises(ValueError, match="one non-empty feed per row"):
        cache.forward([[1]], 1)
    with pytest.raises(ValueError, match="keep = 2"):
        cache.forward([[1], [2, 3]], 2)


def test_a_prompt_prefilled_once_joins_again_without_a_forward():
    model = tiny_lm(vocab=64, seed=3)
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    store = PrefillStore()
    first = RaggedCache(model, "cpu", store)
    first.join([[1, 2, 3], [4, 5]])
    a = first.forward([[9], [9]], 1)
    assert len(calls) == 3 and (store.hits, store.misses) == (0, 2)
    again = RaggedCache(model, "cpu", store)  # the next evaluation of the same prompts
    again.join([[4, 5], [1, 2, 3], [7]])
    b = again.forward([[9], [9], [9]], 1)
    assert len(calls) == 5 and (store.hits, store.misses) == (2, 3)  # only [7] was prefilled
    fresh = RaggedCache(model, "cpu")  # the same batch, every prompt prefilled anew: the stored ones change nothing
    fresh.join([[4, 5], [1, 2, 3], [7]])
    assert torch.equal(b, fresh.forward([[9], [9], [9]], 1))
    # against the first batch (2 rows, not 3) only to rounding: the BLAS may block other shapes otherwise
    # (an AMX Xeon differed by 6e-8)
    assert torch.allclose(b[0], a[1], atol=1e-6) and torch.allclose(b[1], a[0], atol=1e-6)
    # a budget of about two prompts: the least recently used goes first
    one_token = store.get([7])
    per_token = sum(k.numel() * k.element_size() * 2 for k, _ in one_token)
    two_tokens = [(k.repeat(1, 1, 2, 1), v.repeat(1, 1, 2, 1)) for k, v in one_token]
    small = PrefillStore(max_bytes=5 * per_token)
    for ids in ([1, 2], [3, 4], [5, 6]):
        small.put(ids, two_tokens)
        small.get([1, 2])  # keeps [1, 2] recently used
    assert set(small.items) == {(1, 2), (5, 6)} and small.bytes == 4 * per_token
