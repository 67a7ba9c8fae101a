"""A stand-in for an SGLang 0.5.23 server, for tests on CPU.

Serves ``POST /generate`` with SGLang 0.5.23's native response layout
(``docs/reference/sglang-protocol.md``), backed by a real (small) transformers
model, plus ``GET /health``, ``GET /server_info`` and ``POST /set_internal_state``.
Where the real server's behaviour matters to a client, the stand-in does what
SGLang 0.5.23's source does (file and function named at each place):

- with ``max_new_tokens: 0`` the bonus row stays (``output_top_logprobs`` and
  ``output_token_ids_logprobs`` of length 1; ``output_token_logprobs`` and
  ``output_ids`` empty), as a live SGLang 0.5.23 server answers (not as
  ``sglang-protocol.md`` says);
- ``input_token_logprobs`` reports an input id at or above ``vocab_size - 1``
  as 0 (``SchedulerLogprobResultProcessor._process_input_token_logprobs``);
- ``input_top_logprobs`` / ``input_token_ids_logprobs`` start with a null
  boundary entry; ``token_ids_logprob`` answers at every input position and at
  the output position, and its keys are absent when it was not sent
  (``TokenizerManager.add_logprob_to_meta_info``); text entries are null;
- ``cached_tokens`` is the longest prefix shared with an earlier request,
  capped at ``logprob_start_len`` (``Req._compute_max_prefix_len``);
- ``/model_info`` (and its deprecated alias ``/get_model_info``) reports
  ``model_path`` and ``served_model_name`` (``http_server.py``);
- ``/server_info`` gives the launch flags at the top level and the live values
  (changed by ``/set_internal_state``) in ``internal_states``
  (``SchedulerInternalStateController``).

``faults`` injects failures, one per request: "500", "truncate" (a cut JSON
body), "drop" (close without answering), "zero-logprobs" and "positive-logprobs"
(every logprob of the answer 0.0, or 0.5: rows that are not log-probabilities,
as a broken server could return).

``StandInSpecServer`` stands in for a STANDALONE speculative server (the
``sglang_threshold`` method): the first token comes from the verifier's prefill,
then verify rounds run the threshold rule (``relaxtune.engine`` on the
drafter/verifier pair, the rule checked against SGLang's kernel in the tests);
a response finished without a verify round carries no ``spec_*`` keys
(``TokenizerManager._calculate_spec_decoding_metrics``), and ``sampling_seed``
is ignored unless the server runs deterministic inference
(``SamplingBatchInfo.from_schedule_batch``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from ..backends.hf_batch import common_prefix

__all__ = ["StandInServer", "StandInSpecServer", "SGLANG_DEFAULTS"]

VERSION = "0.5.23"
# SGLang 0.5.23's SamplingParams defaults: what a parameter left out of a native
# /generate request becomes (no generation_config defaults on this endpoint)
SGLANG_DEFAULTS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "stop": None,
    "ignore_eos": False,
    "sampling_seed": None,
    "max_new_tokens": 128,
}
UPDATABLE = ("pp_max_micro_batch_size", "speculative_accept_threshold_single", "speculative_accept_threshold_acc")


def _entry(logprob: float, token: int) -> list:
    return [float(logprob), int(token), None]  # return_text_in_logprobs is off: null text


def _top(logprobs: torch.Tensor, k: int) -> list:
    vals, ids = logprobs.topk(min(k, logprobs.shape[-1]))
    return [_entry(v, i) for v, i in zip(vals, ids)]


_BAD_LOGPROBS = {"zero-logprobs": 0.0, "positive-logprobs": 0.5}


def _set_logprobs(meta: dict, value: float) -> None:
    """Every ``[logprob, id, text]`` entry of ``meta``'s logprob fields set to ``value``."""

    def visit(node):
        if isinstance(node, list) and len(node) == 3 and isinstance(node[0], float) and isinstance(node[1], int):
            node[0] = value
        elif isinstance(node, list):
            for item in node:
                visit(item)

    for key, entries in meta.items():
        if key.endswith("logprobs"):
            visit(entries)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that hung up (closed, cancelled, timed out) is no server error."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class StandInServer:
    """An HTTP server on 127.0.0.1 answering like SGLang, backed by ``model``.

    Args:
        model: a transformers causal LM (float32 recommended).
        port: 0 picks a free port.
        preferred_sampling_params: as ``--preferred-sampling-params``: merged into
            every request's parameters it leaves out.
    """

    def __init__(
        self, model, port: int = 0, preferred_sampling_params: dict | None = None, model_path: str = "standin-model"
    ) -> None:
        self.model = model.eval()
        self.model_path = model_path
        self.vocab_size = int(model.config.vocab_size)
        self.preferred = dict(preferred_sampling_params or {})
        self.launch = {
            "device": "cpu",  # a stand-in runs on the CPU (SGLang's ServerArgs.device)
            "dtype": str(model.dtype).removeprefix("torch."),  # ServerArgs.dtype: what it runs the model at
            "speculative_algorithm": None,
            "speculative_num_steps": None,
            "speculative_eagle_topk": None,
            "speculative_num_draft_tokens": None,
            "speculative_accept_threshold_single": 1.0,
            "speculative_accept_threshold_acc": 1.0,
            "enable_deterministic_inference": False,
            "pp_max_micro_batch_size": None,
            "preferred_sampling_params": self.preferred or None,
        }
        self.live: dict = {}
        self.faults: list[str] = []
        self.payloads: list[dict] = []  # every /generate body received
        self.requests = 0
        self.in_flight = self.peak_in_flight = 0  # concurrent /generate requests (now, at most)
        self.seen: list[tuple[int, ...]] = []
        self.delay = 0.0  # seconds each /generate waits before answering (to observe concurrency)
        self._lock = threading.Lock()
        self._count = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/server_info":
                    self._send(200, json.dumps(server.server_info()).encode(), "application/json")
                elif self.path in ("/model_info", "/get_model_info"):
                    info = {
                        "model_path": server.model_path,
                        "served_model_name": server.model_path,
                        "tokenizer_path": server.model_path,
                        "is_generation": True,
                        "preferred_sampling_params": server.preferred or None,
                        "weight_version": "default",
                    }
                    self._send(200, json.dumps(info).encode(), "application/json")
                else:
                    self._send(404, b"not found")

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/set_internal_state":
                    return self._send(200, json.dumps(server.set_internal_state(payload)).encode(), "application/json")
                if self.path != "/generate":
                    return self._send(404, b"not found")
                with server._count:
                    server.requests += 1
                    server.payloads.append(payload)
                    server.in_flight += 1
                    server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
                    fault = server.faults.pop(0) if server.faults else None
                try:
                    return self._post(payload, fault)
                finally:
                    with server._count:
                        server.in_flight -= 1

            def _post(self, payload, fault):
                if server.delay:
                    time.sleep(server.delay)
                if fault == "500":
                    return self._send(500, b"internal error (injected)")
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return None
                try:
                    answer = server.answer(payload)
                except ValueError as err:
                    return self._send(400, str(err).encode())
                if fault in _BAD_LOGPROBS:
                    _set_logprobs(answer["meta_info"], _BAD_LOGPROBS[fault])
                body = json.dumps(answer).encode()
                if fault == "truncate":
                    body = body[: len(body) // 2]
                return self._send(200, body, "application/json")

            def _send(self, code, body, ctype="text/plain"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = _QuietServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> StandInServer:
        """Serve in a background thread."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (a client then sees connection errors)."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def server_info(self) -> dict:
        """``GET /server_info``: launch flags at the top level, the live values of
        this (single data-parallel rank) server in ``internal_states``."""
        return {**self.launch, "internal_states": [{**self.launch, **self.live}], "version": VERSION}

    def set_internal_state(self, payload: dict) -> list[bool]:
        """``POST /set_internal_state`` with ``{"server_args": {...}}``: one flag per
        rank, false (nothing changed) when a key cannot be updated at run time."""
        changes = payload.get("server_args", {})
        if any(k not in UPDATABLE for k in changes):
            return [False]
        self.live.update(changes)
        return [True]

    def sampling_params(self, payload: dict) -> dict:
        """The request's parameters over ``--preferred-sampling-params`` over
        SGLang's defaults (``TokenizerManager._create_tokenized_object``)."""
        return {**SGLANG_DEFAULTS, **self.preferred, **payload.get("sampling_params", {})}

    def answer(self, payload: dict) -> dict:
        """The response body for a ``/generate`` payload."""
        ids = [int(t) for t in payload["input_ids"]]
        sp = self.sampling_params(payload)
        if sp["temperature"] == 0 and sp["max_new_tokens"] > 1 and not payload.get("return_logprob"):
            return self._decode(ids, int(sp["max_new_tokens"]))
        if sp["max_new_tokens"] not in (0, 1) or sp["temperature"] != 0:
            raise ValueError(
                "the stand-in serves greedy requests for at most one token, or greedy decodes without logprobs only"
            )
        n_out = int(sp["max_new_tokens"])
        start = int(payload.get("logprob_start_len", len(ids) - 1))
        k = int(payload.get("top_logprobs_num", 0))
        asked = payload.get("token_ids_logprob")
        with torch.inference_mode(), self._lock:
            lp = self.model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
            cached = max((common_prefix(ids, list(s)) for s in self.seen), default=0)
            self.seen.append(tuple(ids))
        reported = [t if t < self.vocab_size - 1 else 0 for t in ids]  # the 0.5.23 rewrite
        tok = [[None, reported[start], None]] + [
            _entry(lp[pos - 1, ids[pos]], reported[pos]) for pos in range(start + 1, len(ids))
        ]
        last = lp[-1]
        nxt = int(last.argmax())
        meta = {
            "id": f"req-{self.requests}",
            "finish_reason": {"type": "length", "length": n_out},
            "prompt_tokens": len(ids),
            "weight_version": "default",
            "num_retractions": 0,
            "input_token_logprobs": tok,
            "output_token_logprobs": [_entry(last[nxt], nxt)][:n_out],
            "output_token_logprobs_length": n_out,
        }
        if k > 0:
            meta["input_top_logprobs"] = [None] + [_top(lp[pos - 1], k) for pos in range(start + 1, len(ids))]
            meta["output_top_logprobs"] = [_top(last, k)]
        if asked is not None:
            meta["input_token_ids_logprobs"] = [None] + [
                [_entry(lp[pos - 1, t], t) for t in asked] for pos in range(start + 1, len(ids))
            ]
            meta["output_token_ids_logprobs"] = [[_entry(last[t], t) for t in asked]]
        meta.update(reasoning_tokens=0, completion_tokens=n_out, cached_tokens=min(cached, start))
        return {"text": "", "output_ids": [nxt][:n_out], "meta_info": meta}

    def _decode(self, ids: list[int], n_out: int) -> dict:
        """A plain greedy decode of ``n_out`` tokens (EOS ignored; no logprobs): the shape of
        plain AR serving, which the SGLang client's cost profile times
        (``relaxtune.backends.sglang_costs``)."""
        out = []
        with torch.inference_mode(), self._lock:
            for _ in range(n_out):
                out.append(int(self.model(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax()))
            cached = max((common_prefix(ids, list(s)) for s in self.seen), default=0)
            self.seen.append(tuple(ids))
        meta = {
            "id": f"req-{self.requests}",
            "finish_reason": {"type": "length", "length": n_out},
            "prompt_tokens": len(ids),
            "completion_tokens": n_out,
            "cached_tokens": min(cached, len(ids) - 1),
        }
        return {"text": "", "output_ids": out, "meta_info": meta}


class StandInSpecServer(StandInServer):
    """A stand-in STANDALONE speculative server running ``sglang_threshold`` at
    ``(threshold, n_draft)`` with ``drafter`` inside ``verifier``'s server.

    Args:
        keys: the (accepted, proposed) counter names to report: SGLang 0.5.23's
            ``("spec_num_correct_drafts", "spec_num_proposed_drafts")`` (with its
            accept rate and length), or another generation of
            ``relaxtune.backends.sglang_native.TELEMETRY_KEYS`` (or any pair, to
            mimic a future rename).
        deterministic: launched with ``--enable-deterministic-inference``; without
            it ``sampling_seed`` is ignored and every response draws fresh randomness.
        tokenizer: decodes ``text`` (ids as text without one).
        preferred_sampling_params: as ``StandInServer``.
    """

    def __init__(
        self,
        drafter,
        verifier,
        threshold: float,
        n_draft: int,
        keys: tuple[str, str] = ("spec_num_correct_drafts", "spec_num_proposed_drafts"),
        deterministic: bool = True,
        tokenizer=None,
        port: int = 0,
        preferred_sampling_params: dict | None = None,
    ) -> None:
        from ..backends.hf import HFBackend

        super().__init__(verifier, port, preferred_sampling_params)
        self.pair = HFBackend(drafter, verifier, tokenizer, name="stand-in")
        self.n_draft, self.keys = int(n_draft), keys
        self.launch.update(
            speculative_algorithm="STANDALONE",
            speculative_num_steps=self.n_draft,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=self.n_draft + 1,
            speculative_accept_threshold_single=float(threshold),
            speculative_accept_threshold_acc=float(threshold),
            enable_deterministic_inference=bool(deterministic),
        )

    @property
    def threshold(self) -> float:
        """The live threshold (``speculative_accept_threshold_acc``; launch flag or
        the last ``/set_internal_state``)."""
        return float({**self.launch, **self.live}["speculative_accept_threshold_acc"])

    def answer(self, payload: dict) -> dict:
        """A whole response: the verifier's prefill token, then verify rounds with
        the threshold rule until EOS, a stop string or ``max_new_tokens``."""
        from ..decoding.sampling import SamplingParams
        from ..engine.sequence import AR, generate

        sp = self.sampling_params(payload)
        ids = [int(t) for t in payload["input_ids"]]
        top_k = int(sp["top_k"])
        sampling = SamplingParams(float(sp["temperature"]), top_k if top_k > 0 else None, float(sp["top_p"]))
        if self.launch["enable_deterministic_inference"]:
            seed = 42 if sp["sampling_seed"] is None else int(sp["sampling_seed"])
        else:  # SGLang then draws its coins with torch.rand: the seed is ignored
            seed = secrets.randbits(62)
        stop = [sp["stop"]] if isinstance(sp["stop"], str) else list(sp["stop"] or [])
        budget = int(sp["max_new_tokens"])
        with self._lock:
            first = generate(self.pair, ids, method=AR, sampling=sampling, max_new_tokens=1, seed=seed, stop=stop)
            out, rest = list(first.token_ids), None
            if budget > 1 and first.stats.finish_reason != "stop":  # not EOS, no stop string
                rest = generate(
                    self.pair,
                    ids + out,
                    method="sglang_threshold",
                    knob=self.threshold,
                    n_draft=self.n_draft,
                    sampling=sampling,
                    max_new_tokens=budget - 1,
                    seed=seed,
                    stop=stop,
                )
                out += rest.token_ids
        text = self.pair.decode(out)
        hits = [text.index(s) for s in stop if s and s in text]
        if hits:
            reason = {"type": "stop", "matched": next(s for s in stop if s and text.index(s) == min(hits))}
            text = text[: min(hits)]
        elif out[-1] in self.pair.eos_token_ids:
            reason = {"type": "stop", "matched": out[-1]}
        else:
            reason = {"type": "length", "length": len(out)}
        meta = {
            "id": f"req-{self.requests}",
            "finish_reason": reason,
            "prompt_tokens": len(ids),
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(out),
            "cached_tokens": 0,
        }
        rounds = rest.stats.rounds if rest is not None else 0
        if rounds > 0:  # no verify round: no spec_* key at all
            accepted, proposed = rest.stats.accepted, rounds * self.n_draft
            meta.update({"spec_verify_ct": rounds, self.keys[0]: accepted, self.keys[1]: proposed})
            if self.keys == ("spec_num_correct_drafts", "spec_num_proposed_drafts"):
                meta.update(spec_accept_rate=accepted / proposed, spec_accept_length=len(out) / rounds)
        return {"text": text, "output_ids": out, "meta_info": meta}
