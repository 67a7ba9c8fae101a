"""SGLang's own speculative decoding, for the ``sglang_threshold`` method.

A STANDALONE speculative server (``--speculative-algorithm STANDALONE
--speculative-draft-model-path D --speculative-eagle-topk 1
--speculative-num-steps N --speculative-num-draft-tokens N+1
--speculative-accept-threshold-single t --speculative-accept-threshold-acc t
--enable-deterministic-inference``) runs the whole generation: one
``/generate`` request per response, with every sampling parameter sent
explicitly. Acceptance comes from the response's telemetry
(``docs/reference/sglang-protocol.md``, "Telemetry"), whose key names changed
across SGLang versions: every known generation is parsed, and a response with
none of them is an error, never a zero. What SGLang 0.5.23 does
(``sglang/srt/managers/tokenizer_manager.py``,
``TokenizerManager._calculate_spec_decoding_metrics``):

- the first token comes from the verifier's prefill, the others from verify
  rounds; a response that ends at its first token (EOS or a stop, or
  ``max_new_tokens = 1``) ran no round and carries no ``spec_*`` key at all:
  a valid sample with zero rounds;
- ``spec_num_proposed_drafts = spec_verify_ct * (speculative_num_draft_tokens - 1)``;
  counters that cannot be (accepted drafts above rounds x N, or negative) are
  refused, never clamped;
- ``sampling_seed`` is used only under ``--enable-deterministic-inference``
  (``SamplingBatchInfo``; otherwise the verify coins come from ``torch.rand``):
  a server without it is refused, as its samples would not be reproducible.

N is a launch flag, but the thresholds can change at run time
(``POST /set_internal_state``): the live values are read from ``GET
/server_info``'s ``internal_states`` (one per data-parallel rank,
``SchedulerInternalStateController.get_internal_state``), not its top-level
launch flags, before and after every request. A server serves one point
``(t, N)``: ``NativeSpecServer.check`` refuses any other, naming the flags to
relaunch with (``relaxtune serve --native-threshold t`` does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from .http import AsyncHTTP, ServerClient, SGLangError

__all__ = [
    "NativeSpecServer",
    "SpecTelemetry",
    "parse_spec_telemetry",
    "parse_point",
    "TELEMETRY_KEYS",
    "chain_flags",
    "native_flags",
    "DETERMINISTIC",
]

# (accepted drafts, proposed drafts) key pairs, newest first: 0.5.12+, the aliases
# some versions also write, and <= 0.5.10. The bonus token is not an accepted draft.
TELEMETRY_KEYS = (
    ("spec_num_correct_drafts", "spec_num_proposed_drafts"),
    ("spec_accepted_drafts", "spec_proposed_drafts"),
    ("spec_accept_token_num", "spec_draft_token_num"),
)


@dataclass(frozen=True)
class SpecTelemetry:
    """A response's speculative statistics: verification rounds, accepted and
    proposed drafts (tokens), and the key generation they were read from."""

    rounds: int
    accepted: int
    proposed: int
    keys: tuple[str, str]


def parse_spec_telemetry(
    meta: dict, server: str = "server", n_draft: int | None = None, tokens: int | None = None
) -> SpecTelemetry:
    """Read ``spec_verify_ct`` and the accepted / proposed draft counts from a
    ``/generate`` response's ``meta_info``, whichever SGLang generation wrote them.

    A response without any ``spec_*`` key and at most one token (``completion_tokens``,
    else ``tokens``: the prefill's) ran no verify round: zero rounds, zero drafts.

    Args:
        meta: the response's ``meta_info``.
        server: the server, for messages.
        n_draft: the server's draft length N, to refuse accepted drafts above
            ``rounds * N``.
        tokens: the response's output tokens, when ``meta`` lacks ``completion_tokens``.

    Raises:
        SGLangError: ``spec_verify_ct`` or every known counter pair is missing from
            a response longer than one token (the server is not speculative, or a
            new rename), a value is not an integer, or the counters are impossible
            (negative, accepted above proposed or above ``rounds * N``).
    """
    if "spec_verify_ct" not in meta:
        count = meta.get("completion_tokens", tokens)
        if not any(k.startswith("spec_") for k in meta) and count is not None and int(count) <= 1:
            return SpecTelemetry(0, 0, 0, keys=("", ""))  # ended at the prefill's token: no verify round
        raise SGLangError(
            f"{server}: field 'meta_info.spec_verify_ct' missing from a response of {count} tokens "
            "(only a response of at most one token runs no verify round): is the server speculative "
            "(--speculative-algorithm STANDALONE)?"
        )
    if meta["spec_verify_ct"] == 0 and not any(a in meta or p in meta for a, p in TELEMETRY_KEYS):
        return SpecTelemetry(0, 0, 0, keys=("", ""))  # no round ran (some versions then omit the counters)
    for accepted_key, proposed_key in TELEMETRY_KEYS:
        if accepted_key in meta and proposed_key in meta:
            try:
                values = [int(meta[k]) for k in ("spec_verify_ct", accepted_key, proposed_key)]
            except (TypeError, ValueError):
                raise SGLangError(
                    f"{server}: non-integer speculative counters in meta_info: "
                    f"{ {k: meta[k] for k in ('spec_verify_ct', accepted_key, proposed_key)} }"
                ) from None
            bound = "" if n_draft is None else f" or above rounds x N = {values[0]} x {n_draft}"
            if min(values) < 0 or values[1] > values[2] or (n_draft is not None and values[1] > values[0] * n_draft):
                raise SGLangError(
                    f"{server}: impossible speculative counters (spec_verify_ct, {accepted_key}, "
                    f"{proposed_key}) = {tuple(values)}: negative, or accepted drafts above the proposed"
                    f"{bound}; refused, not clamped"
                )
            return SpecTelemetry(*values, keys=(accepted_key, proposed_key))
    known = ", ".join(f"{a}/{p}" for a, p in TELEMETRY_KEYS)
    spec_keys = sorted(k for k in meta if k.startswith("spec_"))
    raise SGLangError(
        f"{server}: no known accepted/proposed draft counters in meta_info (known: {known}; "
        f"got {spec_keys}): a new SGLang key rename?"
    )


def chain_flags(n_draft: int) -> list[str]:
    """Launch flags of SGLang's STANDALONE speculative decoding with chain drafts
    (top-k 1, N steps, N + 1 draft tokens): strict, at the default thresholds."""
    return [
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-steps",
        str(n_draft),
        "--speculative-num-draft-tokens",
        str(n_draft + 1),
    ]


DETERMINISTIC = "--enable-deterministic-inference"  # without it SGLang ignores sampling_seed


def native_flags(threshold: float, n_draft: int) -> list[str]:
    """The launch flags of a STANDALONE server serving ``sglang_threshold`` at
    ``(threshold, N)``, seeded (deterministic inference)."""
    return chain_flags(n_draft) + [
        "--speculative-accept-threshold-single",
        f"{threshold:g}",
        "--speculative-accept-threshold-acc",
        f"{threshold:g}",
        DETERMINISTIC,
    ]


def parse_point(info: dict, server: str = "server") -> tuple[float, int]:
    """The ``(threshold, N)`` a speculative server runs now, from its ``GET
    /server_info`` body: the live thresholds of ``internal_states`` (every
    data-parallel rank's; the top level holds the launch flags), N from
    ``speculative_num_draft_tokens - 1`` (else ``speculative_num_steps``).

    Raises:
        SGLangError: no ``internal_states``; not a chain speculative server;
            ranks that disagree; thresholds that differ (single != acc: not a
            point of ``sglang_threshold``); or no deterministic inference (the
            server ignores ``sampling_seed``).
    """
    states = info.get("internal_states")
    if not isinstance(states, list) or not states or not all(isinstance(s, dict) for s in states):
        raise SGLangError(
            f"{server}: /server_info has no internal_states, where SGLang reports the live "
            "thresholds (/set_internal_state changes them): is it SGLang 0.5.23?"
        )
    keys = (
        "speculative_algorithm",
        "speculative_eagle_topk",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "speculative_accept_threshold_single",
        "speculative_accept_threshold_acc",
        "enable_deterministic_inference",
    )
    live = [{k: state.get(k, info.get(k)) for k in keys} for state in states]
    if any(rank != live[0] for rank in live):
        raise SGLangError(f"{server}: its data-parallel ranks run different speculative settings: {live}")
    now = live[0]
    if not now["speculative_algorithm"] or now["speculative_eagle_topk"] not in (1, None):
        raise SGLangError(
            f"{server} is not a chain speculative server (algorithm {now['speculative_algorithm']!r}, "
            f"topk {now['speculative_eagle_topk']}); launch it with " + " ".join(native_flags(1.0, 4))
        )
    missing = [k for k in keys[4:6] if now[k] is None]
    if missing or not (now["speculative_num_draft_tokens"] or now["speculative_num_steps"]):
        raise SGLangError(f"{server}: /server_info lacks {', '.join(missing) or 'speculative_num_steps'}")
    drafts = now["speculative_num_draft_tokens"]  # N + 1 per round (SGLang sets it so for topk 1)
    n = int(drafts) - 1 if drafts else int(now["speculative_num_steps"])
    single, acc = float(now["speculative_accept_threshold_single"]), float(now["speculative_accept_threshold_acc"])
    if single != acc:
        raise SGLangError(
            f"{server} runs threshold_single {single:g} != threshold_acc {acc:g}; sglang_threshold "
            "sets both to t (POST /set_internal_state can change them)"
        )
    if not now["enable_deterministic_inference"]:
        raise SGLangError(
            f"{server} ignores sampling_seed (SGLang seeds its verify coins only under {DETERMINISTIC}), "
            "so its samples would not be reproducible: relaunch it with " + " ".join(native_flags(acc, n))
        )
    return acc, n


class NativeSpecServer:
    """A STANDALONE speculative SGLang server (drafter inside it).

    Args:
        url: base URL.
        http: the backend's shared ``relaxtune.backends.sglang.AsyncHTTP``.
        retries, backoff: as ``ServerClient``.
    """

    def __init__(self, url: str, http: AsyncHTTP, retries: int = 3, backoff: float = 0.5) -> None:
        self.server = ServerClient(url, "speculative", http, retries, backoff)

    def point(self) -> tuple[float, int]:
        """The ``(threshold, N)`` the server runs now (``parse_point`` of its
        ``GET /server_info``).

        Raises:
            SGLangError: unreachable; as ``parse_point``.
        """
        return parse_point(self.server.get_json("/server_info"), str(self.server))

    def check(self, threshold: float, n_draft: int) -> None:
        """Refuse a point the server does not serve now.

        Raises:
            SGLangError: naming the flags to relaunch with; as ``point``.
        """
        t, n = self.point()
        if (t, n) != (float(threshold), int(n_draft)):
            raise SGLangError(
                f"{self.server} serves sglang_threshold at threshold {t:g}, N {n}, not "
                f"{threshold:g}, {n_draft}: relaunch it with " + " ".join(native_flags(threshold, n_draft))
            )

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        threshold: float,
        n_draft: int,
        sampling,
        max_new_tokens: int,
        seed: int,
        stop: Sequence[str] = (),
    ) -> tuple[list[int], str, str, SpecTelemetry, float]:
        """One response at ``(threshold, N)``: ``(output ids, text, finish reason
        "stop"/"length", telemetry, wall seconds)``. The server's live point is
        checked before and after the request (thresholds can change at run time).

        Raises:
            SGLangError: as ``check``, ``ServerClient.generate`` and
                ``parse_spec_telemetry``; the point changed during the request; an
                aborted request (a failed sample, never graded).
        """
        self.check(threshold, n_draft)
        params = {
            "max_new_tokens": int(max_new_tokens),
            "temperature": float(sampling.temperature),
            "top_k": int(sampling.top_k) if sampling.top_k else -1,
            "top_p": float(sampling.top_p or 1.0),
            "min_p": 0.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "repetition_penalty": 1.0,
            "stop": list(stop),
            "ignore_eos": False,
            "sampling_seed": int(seed),
        }
        t0 = time.perf_counter()
        body = self.server.generate({"input_ids": [int(t) for t in prompt_ids], "sampling_params": params})
        seconds = time.perf_counter() - t0
        meta = body.get("meta_info")
        if not isinstance(meta, dict) or "output_ids" not in body:
            raise SGLangError(f"{self.server}: field 'meta_info' or 'output_ids' missing in the /generate response")
        reason = (meta.get("finish_reason") or {}).get("type", "")
        if reason == "abort":
            raise SGLangError(f"{self.server} aborted the request: {meta.get('finish_reason')}")
        ids = [int(t) for t in body["output_ids"]]
        telemetry = parse_spec_telemetry(meta, str(self.server), n_draft, len(ids))
        if self.point() != (float(threshold), int(n_draft)):
            raise SGLangError(
                f"{self.server}: its thresholds changed during the request (/set_internal_state); "
                "the sample is discarded"
            )
        return ids, str(body.get("text", "")), "length" if reason == "length" else "stop", telemetry, seconds
