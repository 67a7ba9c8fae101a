"""A task's responses under its budgets: one at a time, or many in a batch.

A response is generated under the task's limits: ``max_new_tokens`` in total,
its stop strings, and for thinking tasks (``TaskSpec.thinks``) the paper's
thinking protocol (``docs/concepts/relaxed-rules.md``): the first
``thinking_budget`` tokens are generated; when they run out with the thinking
still open, the fixed ``answer_now`` text and ``</think>`` are forced, and
generation continues (seed + 1) up to ``max_new_tokens`` in total. Stop strings
of a thinking task apply only to the answer after ``</think>``, from past its
first non-blank character (``relaxtune.engine.sequence.stop_index``): they never
cut the reasoning, and ``"\\n\\n"`` right after ``</think>`` does not end the
response before its answer (a continuation after the forced ``</think>`` is such
an answer from its start).

``generate_responses`` runs many responses of one configuration through
``relaxtune.engine.batch.generate_batch``; a response that needs the forced answer
re-joins the running batch as a continuation, so batched and one-at-a-time
responses are the same.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from typing import Any

from ..backends.base import Backend
from ..decoding.methods import get_method
from ..graders.base import THINK_END, THINK_START
from ..tasks.spec import TaskSpec
from .batch import Request, generate_batch
from .generation import AR, Generation, GenerationStats
from .sequence import generate

__all__ = ["generate_response", "generate_responses", "think_token_ids"]


def think_token_ids(tokenizer) -> tuple[int, int] | None:
    """The ``(<think>, </think>)`` token ids of ``tokenizer``, or None when either is
    not a single token (a model without thinking tokens)."""
    ids = [list(tokenizer.encode(t, add_special_tokens=False)) for t in (THINK_START, THINK_END)]
    return (ids[0][0], ids[1][0]) if all(len(i) == 1 for i in ids) else None


def _decode_kw(backend, spec: TaskSpec, config) -> dict:
    """``generate``'s decoding arguments for ``config`` (a ``DecodeConfig``): method,
    knob, N, sampling, the relaxation scope and, for a thinking task, the think ids."""
    scope = getattr(config, "scope", "all")
    hook = None if config.method == AR else get_method(config.method).round_rule
    keyed = scope == "thinking" or (hook is not None and hook.start is not None)
    think = think_token_ids(backend.tokenizer) if spec.thinks and keyed else None
    return dict(
        method=config.method,
        knob=config.point_knob,
        n_draft=config.n_draft,
        sampling=spec.sampling.params(),
        scope=scope,
        think_ids=think,
    )


def _stop_after(spec: TaskSpec) -> str | None:
    return THINK_END if spec.thinks else None


def _answer_stop_after(spec: TaskSpec, head_text: str) -> str | None:
    """``stop_after`` for a continuation after ``head_text``: ``""`` (the answer
    starts with the continuation, stops apply past its first non-blank character)
    while the head holds no answer text yet; None once it does."""
    if not spec.thinks:
        return None
    answer = head_text.rsplit(THINK_END, 1)[-1] if THINK_END in head_text else ""
    return None if answer.strip() else ""


def _first(spec: TaskSpec, prompt_ids: list[int], seed: int, key: Any = None) -> Request:
    """The first phase: up to the thinking budget (or the whole budget)."""
    return Request(
        prompt_ids, seed, spec.thinking_budget or spec.max_new_tokens, tuple(spec.stop), _stop_after(spec), key
    )


def _after_budget(backend, spec: TaskSpec, first: Generation) -> tuple[str, list[int]] | None:
    """After a first phase that spent the thinking budget: the response so far
    (with the forced answer-now text and ``</think>`` when the thinking is still
    open); None when the first phase is the whole response."""
    if spec.thinking_budget is None or first.stats.finish_reason != "length":
        return None
    text, ids = first.text, list(first.token_ids)
    if THINK_END not in text:
        forced = spec.answer_now + THINK_END + "\n\n"
        text, ids = text + forced, ids + list(backend.tokenizer.encode(forced, add_special_tokens=False))
    return text, ids


def _merge(a: GenerationStats, b: GenerationStats) -> GenerationStats:
    out = GenerationStats()
    for f in fields(GenerationStats):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        setattr(out, f.name, vb if isinstance(va, str) else va + vb)
    return out


def _joined(first: Generation, text: str, ids: list[int], rest: Generation | None) -> Generation:
    """The whole response: the first phase (and forced text) then the continuation."""
    if rest is None:  # no room left after the forced text
        first.stats.response_tokens = len(ids)
        return Generation(ids, text, first.stats, first.extra)
    stats = _merge(first.stats, rest.stats)
    stats.response_tokens = len(ids) + len(rest.token_ids)
    extra = {k: first.extra.get(k, []) + rest.extra.get(k, []) for k in set(first.extra) | set(rest.extra)}
    return Generation(ids + rest.token_ids, text + rest.text, stats, extra)


def generate_response(backend: Backend, spec: TaskSpec, prompt_ids: list[int], config, seed: int) -> Generation:
    """One response under the task's budgets (see the module doc): a batch of one
    (``relaxtune.engine.sequence.generate``).

    Args:
        backend: the model pair; spec: the task; prompt_ids: the prompt's ids.
        config: a ``relaxtune.tune.point_records.DecodeConfig`` (method, knob, N).
        seed: the sample's seed (``relaxtune.tune.evaluation.sample_seed``).

    Raises:
        ValueError: as ``relaxtune.engine.sequence.generate``.
    """
    kw = _decode_kw(backend, spec, config)
    req = _first(spec, prompt_ids, seed)
    first = generate(
        backend,
        prompt_ids,
        max_new_tokens=req.max_new_tokens,
        seed=seed,
        stop=req.stop,
        stop_after=req.stop_after,
        **kw,
    )
    if (head := _after_budget(backend, spec, first)) is None:
        return first
    text, ids = head
    left = spec.max_new_tokens - len(ids)
    rest = (
        None
        if left <= 0
        else generate(
            backend,
            list(prompt_ids) + ids,
            max_new_tokens=left,
            seed=seed + 1,
            stop=req.stop,
            stop_after=_answer_stop_after(spec, text),
            **kw,
        )
    )
    return _joined(first, text, ids, rest)


def generate_responses(
    backend: Backend,
    spec: TaskSpec,
    config,
    items: Iterable[tuple[Any, list[int], int]],
    batch_size: int | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> Iterator[tuple[Any, Generation | Exception]]:
    """Many responses of one configuration, ``batch_size`` at a time (default:
    ``backend.batch_size``); each equals ``generate_response`` of the same prompt
    and seed.

    Args:
        backend: the model pair; spec: the task; config: a ``DecodeConfig``.
        items: ``(key, prompt_ids, seed)`` per response.
        batch_size: most sequences at once.
        on_tokens: called after every round with the tokens it added (progress).

    Yields:
        ``(key, Generation)`` as responses end, or ``(key, exception)`` for one
        that failed (see ``relaxtune.engine.batch.generate_batch``).
    """
    queue = deque(_first(spec, list(ids), seed, (key, list(ids), None)) for key, ids, seed in items)
    kw = _decode_kw(backend, spec, config)
    for req, gen in generate_batch(backend, queue, batch_size=batch_size, on_tokens=on_tokens, **kw):
        key, prompt_ids, head = req.key
        if isinstance(gen, Exception):
            yield key, gen
        elif head is not None:  # a continuation ended
            yield key, _joined(*head, gen)
        elif (after := _after_budget(backend, spec, gen)) is None:
            yield key, gen
        elif (left := spec.max_new_tokens - len(after[1])) <= 0:
            yield key, _joined(gen, *after, None)
        else:  # the forced answer re-joins the running batch
            queue.append(
                Request(
                    prompt_ids + after[1],
                    req.seed + 1,
                    left,
                    req.stop,
                    _answer_stop_after(spec, after[0]),
                    (key, prompt_ids, (gen, *after)),
                )
            )
