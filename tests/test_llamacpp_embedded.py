"""Strict on the llama.cpp backend is lossless on a real GGUF: the embedded 0.5B model
as the verifier, a tiny random drafter with its vocabulary (written here), batched.
Marked slow and opt-in (``RELAXTUNE_SLOW_TESTS=1``: 1,200 samples of the 0.5B model,
minutes on 2 cores); skipped unless the embedded GGUF is already assembled in the cache
(tests never assemble or download models)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'relaxtune[llamacpp]')")
pytest.importorskip("gguf", reason="the gguf package writes the tiny drafter (pip install 'relaxtune[llamacpp]')")

from relaxtune.backends.embedded import DRAFTER, cache_dir
from relaxtune.backends.llamacpp import LlamaCppBackend
from relaxtune.backends.llamacpp_model import LlamaModel
from relaxtune.decoding.sampling import SamplingParams, transform_logits
from relaxtune.engine.batch import Request, generate_batch

from .conftest import P_FLOOR, chi2_pvalue
from .tiny_gguf import vocab_of, write_tiny_gguf

GGUF = cache_dir() / DRAFTER.name / "model.gguf"
PAPER = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
PROMPT = [8420, 1075, 63, 198, 750, 15801, 1445, 982]  # "...def fib(n):" as ids; any ids would do


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("RELAXTUNE_SLOW_TESTS") != "1", reason="slow: set RELAXTUNE_SLOW_TESTS=1 to run it")
@pytest.mark.skipif(
    not (GGUF.is_file() and GGUF.stat().st_size == DRAFTER.size),
    reason=f"the embedded GGUF {GGUF} is not assembled (relaxtune info --models, or any run on it)",
)
def test_strict_is_lossless_on_the_embedded_gguf(tmp_path):
    drafter = write_tiny_gguf(tmp_path / "drafter.gguf", **vocab_of(GGUF), n_embd=32, out_scale=3.0)
    backend = LlamaCppBackend(LlamaModel(drafter, 16, 256), LlamaModel(GGUF, 16, 256), name="0.5b-strict")
    backend.eos_token_ids = frozenset()
    v, model = backend.vocab_size, backend.verifier
    # the verifier's own joint of the first two tokens under the transform, step by step
    slot = model.acquire()
    p1 = transform_logits(model.decode([(slot, 0, PROMPT, 1)]), PAPER)[0]
    joint: dict[int, float] = {}  # first * V + second -> probability, over the support only (V = 151,936)
    for a in p1.nonzero().flatten().tolist():
        model.rollback(slot, len(PROMPT))
        p2 = transform_logits(model.decode([(slot, len(PROMPT), [a], 1)]), PAPER)[0]
        for b in p2.nonzero().flatten().tolist():
            joint[a * v + b] = float(p1[a]) * float(p2[b])
    model.release(slot)
    cells = sorted(joint)
    samples = 1200
    requests = [Request(PROMPT, seed=s, max_new_tokens=2) for s in range(samples)]
    codes, accepted = [], 0
    for _, g in generate_batch(backend, requests, method="strict", n_draft=2, sampling=PAPER, batch_size=16):
        codes.append(g.token_ids[0] * v + g.token_ids[1])
        accepted += g.stats.accepted
    index = {c: i for i, c in enumerate(cells)}  # chi-square over the joint's support
    assert all(c in index for c in codes)
    assert chi2_pvalue(torch.tensor([index[c] for c in codes]), torch.tensor([joint[c] for c in cells])) > P_FLOOR
    assert accepted < samples // 10  # the random drafter is rejected: the residual rule made these tokens
