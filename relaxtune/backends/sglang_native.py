"""SGLang's own speculative decoding, for the ``sglang_threshold`` method.

A STANDALONE speculative server (``--speculative-algorithm STANDALONE
--speculative-draft-model-path D --speculative-eagle-topk 1
--speculative-num-steps N --speculative-num-draft-tokens N+1
--speculative-accept-threshold-single t --speculative-accept-threshold-acc t``)
runs the whole generation: one ``/generate`` request per response, with every
sampling parameter sent explicitly. Acceptance comes from the response's
telemetry (``shared/docs/sglang-protocol.md``, "Telemetry"), whose key names
changed across SGLang versions: every known generation is parsed, and a response
with none of them is an error, never a zero.

The thresholds and N are launch flags, so a server serves one point
``(t, N)``: ``NativeSpecServer.check`` refuses any other, naming the flags to
relaunch with (``relaxtune serve --native-threshold t`` does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from .http import AsyncHTTP, SGLangError, ServerClient

__all__ = ["NativeSpecServer", "SpecTelemetry", "parse_spec_telemetry", "TELEMETRY_KEYS", "chain_flags", "native_flags"]

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


def parse_spec_telemetry(meta: dict, server: str = "server") -> SpecTelemetry:
    """Read ``spec_verify_ct`` and the accepted / proposed draft counts from a
    ``/generate`` response's ``meta_info``, whichever SGLang generation wrote them.

    Raises:
        SGLangError: ``spec_verify_ct`` or every known counter pair is missing (the
            server is not speculative, or a new rename), or a value is not a
            non-negative integer.
    """
    if "spec_verify_ct" not in meta:
        raise SGLangError(f"{server}: field 'meta_info.spec_verify_ct' missing: is the server speculative "
                          "(--speculative-algorithm STANDALONE)?")
    if meta["spec_verify_ct"] == 0 and not any(a in meta or p in meta for a, p in TELEMETRY_KEYS):
        return SpecTelemetry(0, 0, 0, keys=("", ""))  # no round ran (some versions then omit the counters)
    for accepted_key, proposed_key in TELEMETRY_KEYS:
        if accepted_key in meta and proposed_key in meta:
            try:
                values = [int(meta[k]) for k in ("spec_verify_ct", accepted_key, proposed_key)]
            except (TypeError, ValueError):
                raise SGLangError(f"{server}: non-integer speculative counters in meta_info: "
                                  f"{ {k: meta[k] for k in ('spec_verify_ct', accepted_key, proposed_key)} }") from None
            if min(values) < 0 or values[1] > values[2]:
                raise SGLangError(f"{server}: inconsistent speculative counters {values} "
                                  f"(spec_verify_ct, {accepted_key}, {proposed_key})")
            return SpecTelemetry(*values, keys=(accepted_key, proposed_key))
    known = ", ".join(f"{a}/{p}" for a, p in TELEMETRY_KEYS)
    spec_keys = sorted(k for k in meta if k.startswith("spec_"))
    raise SGLangError(f"{server}: no known accepted/proposed draft counters in meta_info (known: {known}; "
                      f"got {spec_keys}): a new SGLang key rename?")


def chain_flags(n_draft: int) -> list[str]:
    """Launch flags of SGLang's STANDALONE speculative decoding with chain drafts
    (top-k 1, N steps, N + 1 draft tokens): strict, at the default thresholds."""
    return ["--speculative-algorithm", "STANDALONE", "--speculative-eagle-topk", "1",
            "--speculative-num-steps", str(n_draft), "--speculative-num-draft-tokens", str(n_draft + 1)]


def native_flags(threshold: float, n_draft: int) -> list[str]:
    """The launch flags of a STANDALONE server serving ``sglang_threshold`` at
    ``(threshold, N)``."""
    return chain_flags(n_draft) + ["--speculative-accept-threshold-single", f"{threshold:g}",
                                   "--speculative-accept-threshold-acc", f"{threshold:g}"]


class NativeSpecServer:
    """A STANDALONE speculative SGLang server (drafter inside it).

    Args:
        url: base URL.
        http: the backend's shared ``relaxtune.backends.sglang.AsyncHTTP``.
        retries, backoff: as ``ServerClient``.
    """

    def __init__(self, url: str, http: AsyncHTTP, retries: int = 3, backoff: float = 0.5) -> None:
        self.server = ServerClient(url, "speculative", http, retries, backoff)
        self._point: tuple[float, int] | None = None

    def point(self) -> tuple[float, int]:
        """The ``(threshold, N)`` the server was launched with, from ``GET /server_info``.

        Raises:
            SGLangError: unreachable, not a chain speculative server, or thresholds
                that differ (single != acc: not a point of ``sglang_threshold``).
        """
        if self._point is None:
            info = self.server.get_json("/server_info")
            missing = [k for k in ("speculative_algorithm", "speculative_num_steps", "speculative_accept_threshold_single",
                                   "speculative_accept_threshold_acc") if k not in info]
            if missing:
                raise SGLangError(f"{self.server}: /server_info lacks {', '.join(missing)}")
            if not info["speculative_algorithm"] or info.get("speculative_eagle_topk", 1) != 1:
                raise SGLangError(f"{self.server} is not a chain speculative server (algorithm "
                                  f"{info['speculative_algorithm']!r}, topk {info.get('speculative_eagle_topk')}); "
                                  "launch it with " + " ".join(native_flags(1.0, 4)))
            single, acc = float(info["speculative_accept_threshold_single"]), float(info["speculative_accept_threshold_acc"])
            if single != acc:
                raise SGLangError(f"{self.server} runs threshold_single {single:g} != threshold_acc {acc:g}; "
                                  "sglang_threshold sets both to t")
            self._point = (acc, int(info["speculative_num_steps"]))
        return self._point

    def check(self, threshold: float, n_draft: int) -> None:
        """Refuse a point the server does not serve.

        Raises:
            SGLangError: naming the flags to relaunch with.
        """
        t, n = self.point()
        if (t, n) != (float(threshold), int(n_draft)):
            raise SGLangError(f"{self.server} serves sglang_threshold at threshold {t:g}, N {n}, not "
                              f"{threshold:g}, {n_draft}: relaunch it with " + " ".join(native_flags(threshold, n_draft)))

    def generate(self, prompt_ids: Sequence[int], *, sampling, max_new_tokens: int, seed: int,
                 stop: Sequence[str] = ()) -> tuple[list[int], str, str, SpecTelemetry, float]:
        """One response: ``(output ids, text, finish reason "stop"/"length",
        telemetry, wall seconds)``.

        Raises:
            SGLangError: as ``ServerClient.generate`` and ``parse_spec_telemetry``;
                an aborted request (a failed sample, never graded).
        """
        params = {"max_new_tokens": int(max_new_tokens), "temperature": float(sampling.temperature),
                  "top_k": int(sampling.top_k) if sampling.top_k else -1, "top_p": float(sampling.top_p or 1.0),
                  "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                  "stop": list(stop), "ignore_eos": False, "sampling_seed": int(seed)}
        t0 = time.perf_counter()
        body = self.server.generate({"input_ids": [int(t) for t in prompt_ids], "sampling_params": params})
        seconds = time.perf_counter() - t0
        meta = body.get("meta_info")
        if not isinstance(meta, dict) or "output_ids" not in body:
            raise SGLangError(f"{self.server}: field 'meta_info' or 'output_ids' missing in the /generate response")
        reason = (meta.get("finish_reason") or {}).get("type", "")
        if reason == "abort":
            raise SGLangError(f"{self.server} aborted the request: {meta.get('finish_reason')}")
        return ([int(t) for t in body["output_ids"]], str(body.get("text", "")),
                "length" if reason == "length" else "stop", parse_spec_telemetry(meta, str(self.server)), seconds)
