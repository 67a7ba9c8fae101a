"""What a response is (``Generation``, ``GenerationStats``), where it ends (``Limits``,
``end_round``, ``stop_index``), the checks before any generation (``check_decode``) and
one request to a native speculative server (``run_native``): shared by the decode loop
(``relaxtune.engine.batch``) and the one-response entry (``relaxtune.engine.sequence``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ..decoding.methods import get_method
from ..decoding.sampling import SamplingParams

__all__ = [
    "GenerationStats",
    "Generation",
    "check_decode",
    "AR",
    "Limits",
    "end_round",
    "stop_index",
    "run_native",
    "cut_native",
    "TELEMETRY",
]

AR = "ar"  # the autoregressive baseline's method id


@dataclass
class GenerationStats:
    """Statistics of one response.

    Attributes:
        rounds: verification rounds (AR: decoding steps).
        drafted: drafted tokens (N per round).
        accepted: accepted drafted tokens that made it into the response (a
            round cut by EOS, a stop string or ``max_new_tokens`` counts only
            the drafts before the cut), so ``l_accept`` describes the response.
        emitted: tokens the rounds put into the response (accepted drafts,
            residual and bonus tokens; ``accepted + rounds`` unless the last
            round's residual or bonus token was cut).
        discarded: tokens the rounds emitted past the response's end (after
            EOS, a stop string or the budget).
        response_tokens: tokens in the final response.
        finish_reason: "stop" (EOS or stop string) or "length".
        draft_seconds / verify_seconds: wall seconds in drafter / verifier
            forwards (in a batch: this response's share of each forward).
        prefill_seconds: wall seconds of prompt prefills run apart from the
            rounds (the batched path; its share when batched).
        wall_seconds: wall seconds of the call (in a batch: this response's
            share of the batch's wall time, so shares add up to the batch's).
        latency_seconds: wall seconds from start (joining the batch) to finish.
        draft_forwards / verify_forwards: forward passes.
    """

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    discarded: int = 0
    response_tokens: int = 0
    finish_reason: str = ""
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0
    latency_seconds: float = 0.0
    draft_forwards: int = 0
    verify_forwards: int = 0

    @property
    def acceptance_length(self) -> float:
        """Mean accepted drafts per round, ``l_accept`` (tokens)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def overhead_seconds(self) -> float:
        """Wall seconds outside model forwards (sampling, rules, bookkeeping)."""
        return self.wall_seconds - self.draft_seconds - self.verify_seconds - self.prefill_seconds

    @property
    def tokens_per_second(self) -> float:
        """Response tokens per wall second."""
        return self.response_tokens / self.wall_seconds if self.wall_seconds else 0.0

    def to_dict(self) -> dict:
        """Plain dict with the derived fields, for records."""
        out = asdict(self)
        out.update(
            acceptance_length=self.acceptance_length,
            overhead_seconds=self.overhead_seconds,
            tokens_per_second=self.tokens_per_second,
        )
        return out


_NONBLANK = re.compile(r"\S")
TELEMETRY = ("missing_mass", "cached_tokens")  # per-round lists a server backend keeps


@dataclass
class Generation:
    """One response: generated ids, decoded text (cut at a stop string), stats,
    and backend telemetry (``missing_mass`` and ``cached_tokens`` lists from servers)."""

    token_ids: list[int]
    text: str
    stats: GenerationStats
    extra: dict = field(default_factory=dict)


def _finish(tokens: list[int], done: int, max_new_tokens: int, eos: frozenset[int]) -> tuple[list[int], str]:
    """Cut ``tokens`` at the first EOS (kept) or at the token budget."""
    for i, t in enumerate(tokens):
        if done + i + 1 > max_new_tokens:
            return tokens[:i], "length"
        if t in eos:
            return tokens[: i + 1], "stop"
    if done + len(tokens) >= max_new_tokens:
        return tokens, "length"
    return tokens, ""


def _cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    hits = [text.index(s) for s in stop if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def stop_index(text: str, stop: Sequence[str], stop_after: str | None = None) -> int | None:
    """Where ``text`` is cut: the start of the earliest stop string; None when no
    stop string occurs. Empty stop strings never match.

    With ``stop_after`` (``</think>`` for a thinking task; ``""`` for an answer
    that starts at the text's beginning) stops apply only to the answer: the text
    after the first ``stop_after``, from just past its first non-blank character
    (None while there is none). A task whose stops include ``"\\n\\n"`` so keeps a
    response that writes ``</think>\\n\\n`` before its answer, and no stop cuts an
    answer to nothing."""
    start = 0
    if stop_after is not None:
        at = text.find(stop_after)
        if at < 0:
            return None
        first = _NONBLANK.search(text, at + len(stop_after))
        if first is None:
            return None
        start = first.start() + 1
    hits = [i for s in stop if s and (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def _stop_cut(
    decode, generated: list[int], new: list[int], stop: Sequence[str], stop_after: str | None
) -> tuple[int, str] | None:
    """When a stop string completes inside ``new`` (this round's kept tokens),
    the number of them up to and including the token that completes it, and the
    response text cut before the stop string; else None."""
    if stop_index(decode(generated + new), stop, stop_after) is None:
        return None
    for k in range(1, len(new) + 1):
        text = decode(generated + new[:k])
        if (at := stop_index(text, stop, stop_after)) is not None:
            return k, text[:at]
    raise AssertionError("unreachable: the whole round's text holds a stop string")


@dataclass(frozen=True)
class Limits:
    """Where a response ends: ``max_new_tokens`` (tokens), EOS ids, ``stop``
    strings (searched only after ``stop_after`` when given, e.g. ``</think>``)."""

    max_new_tokens: int
    eos: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    stop_after: str | None = None


def end_round(
    stats: GenerationStats, generated: list[int], emitted: list[int], accepted: int, limits: Limits, decode
) -> tuple[list[int], str, str | None]:
    """Account one round of one sequence and cut its tokens where the response ends.

    Args:
        stats: the response's statistics (rounds, accepted, emitted, discarded updated).
        generated: the response's tokens before this round.
        emitted: the round's tokens (accepted drafts, then the residual or bonus).
        accepted: accepted drafts among them.
        limits: budget, EOS, stop strings.
        decode: token ids to text.

    Returns:
        ``(kept, reason, text)``: the tokens to commit, "stop" / "length" / ""
        (go on), and the final text when a stop string ended the response (None
        otherwise). A stop string cuts the ids through the token that completes
        it, the text before the stop string, and the statistics at the ids' cut.
    """
    kept, reason = _finish(emitted, len(generated), limits.max_new_tokens, limits.eos)
    text = None
    if limits.stop and (cut := _stop_cut(decode, generated, kept, limits.stop, limits.stop_after)) is not None:
        (k, text), reason = cut, "stop"
        kept = kept[:k]
    stats.rounds += 1
    stats.accepted += min(accepted, len(kept))
    stats.emitted += len(kept)
    stats.discarded += len(emitted) - len(kept)
    return kept, reason, text


def check_decode(
    method: str, knob: float | None, n_draft: int, temperature: float, max_new_tokens: int = 1
) -> float | None:
    """Validate a decoding configuration before any generation; return the knob as
    a float (None for knob-less methods and AR).

    Raises:
        ValueError: unknown method, a knob for AR, knob out of range, T = 0 with a
            method that collapses to strict, N not an integer >= 1 or one the method cannot
            run at (``MethodSpec.check_n_draft``), max_new_tokens < 1.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens!r}")
    if method == AR:
        if knob is not None:
            raise ValueError("the AR baseline has no knob (alpha)")
        return None
    spec = get_method(method)
    knob = spec.check_knob(knob)
    spec.check_temperature(temperature)
    if int(n_draft) != n_draft or n_draft < 1:
        raise ValueError(f"n_draft must be an integer >= 1, got {n_draft!r}")
    spec.check_n_draft(int(n_draft))
    return knob


def run_native(
    server,
    prompt_ids,
    knob: float,
    n_draft: int,
    sampling: SamplingParams,
    max_new_tokens: int,
    seed: int,
    stop: Sequence[str],
) -> Generation:
    """``sglang_threshold`` run by SGLang's own speculative server (one request).
    The server's first token comes from the verifier's prefill, the rest from
    verify rounds: ``emitted`` is ``rounds + accepted + 1``, and a response that
    ends at its first token has zero rounds (a valid sample)."""
    ids, text, reason, tel, seconds = server.generate(
        prompt_ids,
        threshold=knob,
        n_draft=n_draft,
        sampling=sampling,
        max_new_tokens=max_new_tokens,
        seed=seed,
        stop=stop,
    )
    text, hit = _cut_at_stop(text, stop)
    stats = GenerationStats(
        rounds=tel.rounds,
        drafted=tel.proposed,
        accepted=tel.accepted,
        emitted=tel.rounds + tel.accepted + 1,
        response_tokens=len(ids),
        finish_reason="stop" if hit else reason,
        wall_seconds=seconds,
    )
    return Generation(ids, text, stats, {"telemetry_keys": list(tel.keys)})


def cut_native(gen: Generation, decode, stop: Sequence[str], stop_after: str) -> Generation:
    """A native server's response with stop strings that apply only after
    ``stop_after`` (the server itself would fire them inside the reasoning): ids
    and text cut as ``end_round`` cuts them (the server's counters cover the whole
    generation)."""
    if (cut := _stop_cut(decode, [], list(gen.token_ids), stop, stop_after)) is None:
        return gen
    k, text = cut
    gen.stats.response_tokens, gen.stats.finish_reason = k, "stop"
    return Generation(list(gen.token_ids)[:k], text, gen.stats, gen.extra)
