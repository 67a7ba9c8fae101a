"""The decode loop: many responses of one decoding configuration advance together
(one response is a batch of one: ``relaxtune.engine.sequence.generate``; what a
response is and where it ends: ``relaxtune.engine.generation``).

``generate_batch`` keeps up to ``batch_size`` sequences (rows) in a
backend's ``Batch`` (``relaxtune.backends.base.Backend``). Each round drafts N tokens for every row (one drafter
forward per step), scores all rows in one verifier pass, runs
``relaxtune.decoding.round.verify_rounds`` on the ``[R, N+1, V]`` rows (ragged
acceptance), and commits each row's tokens. A row that ends (EOS, stop string,
budget) leaves the batch and the next request joins at once (continuous refill).

Randomness is per response, exactly as ``relaxtune.engine.sequence.generate``: one
``torch.Generator`` seeded with the request's seed, N uniforms drawn for drafting
and then N + 1 for verification per round (1 per AR step), in the same order.
So a response does not depend on the batch it ran in: with float32 models a
batch of R rows equals a batch of one token for token (up to float rounding of
the batched forwards, which can move a sample that sits on a boundary); with
bfloat16 the rounding differences are larger, as between any two batch shapes.

Relaxation scope (``relaxtune.decoding.scope``): at scope ``"thinking"`` each row
carries whether it is inside the thinking segment (from its prompt, then from the
tokens each round emits), given the model's ``<think>``/``</think>`` ids; a rule that
carries the thinking state itself (TensorRT-LLM's) gets the same state at any scope.

``sglang_threshold`` on a backend with a native speculative server
(``relaxtune.backends.base.native_server``) is one request to that server per
response, ``batch_size`` requests in flight.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends.base import Backend, SequenceState, native_server
from ..decoding.methods import Needs, get_method
from ..decoding.round import verify_rounds
from ..decoding.sampling import SamplingParams, draw_uniforms, sample_from_rows, transform_logits
from ..decoding.scope import NO_THINK_ID, SCOPES, ThinkingState, thinking_state
from .generation import (
    AR,
    TELEMETRY,
    Generation,
    GenerationStats,
    Limits,
    check_decode,
    cut_native,
    end_round,
    run_native,
)

__all__ = ["Request", "generate_batch"]


@dataclass(frozen=True)
class Request:
    """One response to generate.

    Attributes:
        prompt_ids: prompt token ids (at least one).
        seed: seed of this response's random numbers.
        max_new_tokens: generation budget (tokens, >= 1).
        stop: stop strings (see ``relaxtune.engine.sequence.generate``).
        stop_after: stop strings count only after this text (``</think>``).
        key: anything the caller needs to recognise the response.

    Raises:
        ValueError: an empty prompt or a budget below 1.
    """

    prompt_ids: Sequence[int]
    seed: int
    max_new_tokens: int
    stop: Sequence[str] = ()
    stop_after: str | None = None
    key: Any = None

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError("a request's prompt must hold at least one token")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")


@dataclass
class _Row:
    request: Request
    state: SequenceState
    gen: torch.Generator
    limits: Limits
    started: float
    thinking: bool = False  # inside the thinking segment at the next round's start
    stats: GenerationStats = field(default_factory=GenerationStats)
    text: str | None = None
    reason: str = ""


def _result(row: _Row, decode) -> Generation:
    s, st = row.stats, row.state
    s.response_tokens, s.finish_reason = len(st.generated), row.reason
    s.draft_seconds, s.verify_seconds, s.prefill_seconds = st.draft_seconds, st.verify_seconds, st.prefill_seconds
    s.draft_forwards, s.verify_forwards = st.draft_forwards, st.verify_forwards
    s.latency_seconds = time.perf_counter() - row.started
    extra = {k: list(st.extra[k]) for k in TELEMETRY if k in st.extra}
    return Generation(list(st.generated), decode(st.generated) if row.text is None else row.text, s, extra)


def generate_batch(
    backend: Backend,
    requests: Iterable[Request],
    *,
    method: str = "strict",
    knob: float | None = None,
    n_draft: int = 4,
    sampling: SamplingParams = SamplingParams(),
    batch_size: int | None = None,
    on_tokens: Callable[[int], None] | None = None,
    scope: str = "all",
    think_ids: tuple[int, int] | None = None,
) -> Iterator[tuple[Request, Generation | Exception]]:
    """Generate every request, ``batch_size`` at a time; yield each as it ends.

    Args:
        backend: the model pair (``relaxtune.backends.base.Backend``).
        requests: the responses to generate. A ``collections.deque`` is consumed
            from the left as rows free up, and the caller may append to it while
            iterating (a continuation, e.g. after a thinking budget, joins the
            running batch).
        method: a method id of ``relaxtune.decoding.methods.METHODS``, or ``"ar"``.
        knob: the method's knob (alpha).
        n_draft: draft length N >= 1 (ignored for AR).
        sampling: the sampling transform, applied to both models.
        batch_size: most rows at once (default: ``backend.batch_size``).
        on_tokens: called after every round with the tokens the round added to all
            rows (progress); an exception it raises stops the batch (e.g. a stop request).
        scope: the relaxation scope, ``"all"`` or ``"thinking"`` (relax inside the
            thinking segment only; ``relaxtune.decoding.scope``).
        think_ids: the model's ``(<think>, </think>)`` token ids; needed at scope
            ``"thinking"`` (None: the model has no such tokens, so a rule keyed on
            thinking never relaxes).

    Yields:
        ``(request, Generation)`` in the order responses end; ``(request,
        exception)`` for a request whose prompt could not join, and for every
        row of a round whose forward failed (the batch then starts afresh).
        ``wall_seconds`` is each response's share of the batch's wall time (so
        shares add up to the elapsed time), ``latency_seconds`` its own span.

    Raises:
        ValueError: as ``relaxtune.engine.sequence.check_decode``, batch_size < 1, an
            unknown scope, scope ``"thinking"`` without ``think_ids`` or on a native
            speculative server (server-wide: it cannot scope).
    """
    ar = method == AR
    knob = check_decode(method, knob, n_draft, sampling.temperature)
    spec = None if ar else get_method(method)
    extra_step = spec is not None and Needs.EXTRA_DRAFTER_STEP in spec.needs and not spec.is_strict(knob)
    # one-hot q at the drafter's argmax: SGLang's target-only rule, or a point-mass drafter (prompt lookup)
    greedy_drafts = spec is not None and (Needs.GREEDY_DRAFTS in spec.needs or backend.point_mass_drafts)
    size = int(batch_size or backend.batch_size)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    queue = requests if isinstance(requests, deque) else deque(requests)
    start = _thinking_start(spec, scope, think_ids)
    server = native_server(backend, method)
    if server is not None and scope == "thinking":
        raise ValueError(f"{method} on a native speculative server is server-wide: it cannot relax in thinking only")
    if server is not None:
        yield from _native_all(server, backend.decode, queue, size, knob, n_draft, sampling, on_tokens)
        return
    scoping = None if start is None else (scope, *(think_ids or (NO_THINK_ID, NO_THINK_ID)))
    batch, rows = backend.start_batch(), []
    while queue or rows:
        while queue and len(rows) < size:  # continuous refill: one prefill per joining prompt
            request = queue.popleft()
            t0 = time.perf_counter()
            try:
                (state,) = backend.join(batch, [list(request.prompt_ids)])
            except Exception as err:
                yield request, err
                continue
            limits = Limits(request.max_new_tokens, backend.eos_token_ids, tuple(request.stop), request.stop_after)
            row = _Row(request, state, torch.Generator().manual_seed(int(request.seed)), limits, t0)
            if scoping is not None:
                row.thinking = bool(start([request.prompt_ids], *scoping[1:]).thinking[0])
            row.stats.wall_seconds = time.perf_counter() - t0
            rows.append(row)
        if not rows:
            continue
        t0 = time.perf_counter()
        try:
            outs = _round(backend, batch, rows, ar, spec, knob, n_draft, sampling, extra_step, greedy_drafts, scoping)
        except Exception as err:
            for row in rows:
                yield row.request, err
            batch, rows = backend.start_batch(), []
            continue
        kept = []
        for row, (emitted, accepted) in zip(rows, outs):
            if not ar:
                row.stats.drafted += n_draft
            tokens, row.reason, row.text = end_round(
                row.stats, row.state.generated, emitted, accepted, row.limits, backend.decode
            )
            kept.append(tokens)
        backend.commit_batch(batch, kept)
        if on_tokens is not None:
            on_tokens(sum(len(t) for t in kept))
        share = (time.perf_counter() - t0) / len(rows)
        for row in rows:
            row.stats.wall_seconds += share
        done = [i for i, row in enumerate(rows) if row.reason]
        if done:
            backend.leave(batch, done)
            finished = [rows[i] for i in done]
            rows = [row for i, row in enumerate(rows) if not row.reason]
            for row in finished:
                yield row.request, _result(row, backend.decode)


def _thinking_start(spec, scope: str, think_ids: tuple[int, int] | None):
    """The function that builds a row's thinking state from its prompt, or None when the
    rows carry none (scope ``"all"`` with a rule that keeps no thinking state).

    Raises:
        ValueError: an unknown scope, or scope ``"thinking"`` without ``think_ids``.
    """
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    hook = None if spec is None else spec.round_rule
    keyed = hook is not None and hook.needs_state and hook.start is not None
    if spec is None or (scope == "all" and not keyed):
        return None
    if scope == "thinking" and think_ids is None:
        raise ValueError(
            "scope thinking needs the model's <think> and </think> token ids (think_ids): this tokenizer has no "
            "single token for each"
        )
    return hook.start if keyed else thinking_state


def _native_all(
    server, decode, queue: deque, size: int, knob: float, n_draft: int, sampling: SamplingParams, on_tokens
) -> Iterator[tuple[Request, Generation | Exception]]:
    """Every request as one call of the native speculative server, ``size`` in flight
    (in the order they end; a request appended to ``queue`` meanwhile joins)."""

    def one(r: Request) -> Generation:
        if r.stop_after is None or not r.stop:
            return run_native(server, r.prompt_ids, knob, n_draft, sampling, r.max_new_tokens, r.seed, r.stop)
        gen = run_native(server, r.prompt_ids, knob, n_draft, sampling, r.max_new_tokens, r.seed, ())
        return cut_native(gen, decode, r.stop, r.stop_after)

    pool, running = ThreadPoolExecutor(size), {}
    try:
        while queue or running:
            while queue and len(running) < size:
                request = queue.popleft()
                running[pool.submit(one, request)] = request
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for job in done:
                request = running.pop(job)
                err = job.exception()
                if err is None and on_tokens is not None:
                    on_tokens(job.result().stats.response_tokens)
                yield request, job.result() if err is None else err
    finally:  # a stop: the requests not sent yet are dropped
        pool.shutdown(wait=False, cancel_futures=True)


def _round(
    backend: Backend,
    batch,
    rows: list[_Row],
    ar: bool,
    spec,
    knob,
    n_draft: int,
    sampling: SamplingParams,
    extra_step: bool,
    greedy_drafts: bool,
    scoping: tuple[str, int, int] | None = None,
) -> list[tuple[list[int], int]]:
    """One round (one AR step) for every row: ``(emitted tokens, accepted drafts)`` per row.
    ``scoping``: ``(scope, begin id, end id)`` when the rows carry a thinking state
    (each row's ``thinking`` is updated from the round's emitted tokens)."""
    if ar:
        z_p = backend.score_batch(batch, torch.zeros(len(rows), 0, dtype=torch.long))[:, 0]
        u = torch.cat([draw_uniforms((1,), row.gen) for row in rows])
        return [([t], 0) for t in sample_from_rows(transform_logits(z_p, sampling), u).tolist()]
    u_draft = torch.stack([draw_uniforms((n_draft,), row.gen) for row in rows])

    def q_of(z: torch.Tensor) -> torch.Tensor:
        """The drafter's distribution ``[R', V]`` of raw rows ``z [R', V]``: one-hot at
        the argmax for greedy drafts (the transform keeps the order), else transformed."""
        if greedy_drafts:
            return torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).float()
        return transform_logits(z, sampling)

    def pick(z: torch.Tensor, i: int, which: Sequence[int] | None = None) -> torch.Tensor:
        """Drafted ids ``[R']`` of the rows ``which`` (all when None) at draft step ``i``."""
        if greedy_drafts:
            return z.argmax(-1)
        return sample_from_rows(q_of(z), u_draft[:, i] if which is None else u_draft[list(which), i])

    ids, z_q = backend.draft_batch(batch, n_draft, pick, extra_step=extra_step)
    q = torch.stack([q_of(z_q[:, i]) for i in range(z_q.shape[1])], 1)
    z_p = backend.score_batch(batch, ids)
    state, scope = None, "all"
    if scoping is not None:
        scope, begin, end = scoping
        state = ThinkingState(torch.tensor([row.thinking for row in rows]), begin, end)
    out = verify_rounds(
        transform_logits(z_p, sampling),
        q,
        ids,
        spec,
        knob,
        uniforms=torch.stack([draw_uniforms((n_draft + 1,), row.gen) for row in rows]),
        z_p=z_p,
        z_q=z_q,
        temperature=sampling.temperature,
        validate=False,
        state=state,
        scope=scope,
    )
    if scoping is not None:
        for row, inside in zip(rows, out.state.thinking.tolist()):
            row.thinking = inside
    return [(r.tokens, r.accepted) for r in map(out.row, range(len(rows)))]
