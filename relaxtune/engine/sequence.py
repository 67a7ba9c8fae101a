"""One response: a batch of one through ``relaxtune.engine.batch.generate_batch``, the
one decode loop (what a response is and where it ends: ``relaxtune.engine.generation``).

Per round: draft N tokens from ``q`` (the drafter's rows after the sampling
transform), score them with the verifier in one pass, run
``relaxtune.decoding.round.verify_rounds`` with the method, commit the emitted tokens.
The AR baseline (``method="ar"``) runs one verifier step per token through the
same backend calls.

Randomness: one ``torch.Generator`` per response seeded with ``seed``. A round
draws N uniforms for drafting (unused by ``sglang_threshold``, whose drafts are
the drafter's argmax, and by a point-mass drafter such as prompt lookup), then
N + 1 for verification; an AR step draws 1.
The same seed gives the same response, and a strict run and a relaxed run with
the same seed share their random numbers (paired comparisons), whatever batch the
response runs in.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backends.base import Backend, native_server
from ..decoding.sampling import SamplingParams
from .batch import Request, generate_batch
from .generation import AR, Generation, GenerationStats, check_decode, stop_index

# named here too for their callers: the types of engine.generation and the backend's native_server
__all__ = ["generate", "Generation", "GenerationStats", "check_decode", "stop_index", "native_server", "AR"]


def generate(
    backend: Backend,
    prompt_ids: Sequence[int],
    *,
    method: str = "strict",
    knob: float | None = None,
    n_draft: int = 4,
    sampling: SamplingParams = SamplingParams(),
    max_new_tokens: int = 256,
    seed: int = 0,
    stop: Sequence[str] = (),
    stop_after: str | None = None,
    scope: str = "all",
    think_ids: tuple[int, int] | None = None,
) -> Generation:
    """Generate one response with speculative decoding (or AR with ``method="ar"``):
    a batch of one through ``relaxtune.engine.batch.generate_batch``, the one loop.

    Args:
        backend: the drafter/verifier pair.
        prompt_ids: prompt token ids.
        method: a method id of ``relaxtune.decoding.methods.METHODS``, or ``"ar"``.
        knob: the method's knob (alpha).
        n_draft: draft length N >= 1 (ignored for AR).
        sampling: the sampling transform, applied to both models.
        max_new_tokens: generation budget (tokens).
        seed: seed of this response's random numbers.
        stop: stop strings; the text is cut before the first one, the ids (and
            the statistics) after the token that completes it.
        stop_after: search stop strings only in the answer after the first
            occurrence of this text, from past the answer's first non-blank
            character (``</think>``: stops never fire inside the reasoning nor on
            the blank lines before the answer; ``stop_index``).
        scope, think_ids: the relaxation scope and the model's ``(<think>, </think>)``
            ids (``relaxtune.engine.batch.generate_batch``).

    Returns:
        ``Generation`` with ids, text and ``GenerationStats``.

    ``sglang_threshold`` on a backend with a ``native`` speculative server
    (``relaxtune.backends.sglang_native``) is one request to that server;
    its statistics come from the server's telemetry.

    Raises:
        ValueError: unknown method, knob out of range, greedy sampling with a
            method that collapses to strict, N < 1, max_new_tokens < 1.
        relaxtune.backends.sglang.SGLangError: the native server serves another
            (threshold, N), or its response cannot be read.
        Exception: whatever the backend raised (a prompt that could not join, a
            failed forward).
    """
    check_decode(method, knob, n_draft, sampling.temperature, max_new_tokens)
    request = Request(list(prompt_ids), seed, max_new_tokens, tuple(stop), stop_after)
    ((_, gen),) = generate_batch(
        backend,
        [request],
        method=method,
        knob=knob,
        n_draft=n_draft,
        sampling=sampling,
        batch_size=1,
        scope=scope,
        think_ids=think_ids,
    )
    if isinstance(gen, Exception):
        raise gen
    gen.stats.wall_seconds = gen.stats.latency_seconds
    return gen
