"""A stand-in for an SGLang server, for tests on CPU.

Serves ``POST /generate`` with SGLang 0.5.23's native response layout
(``shared/docs/sglang-protocol.md``), backed by a real (small) transformers
model, plus ``GET /health``. Supports what relaxtune's client sends: one-token
greedy requests with ``return_logprob``, ``logprob_start_len``,
``top_logprobs_num`` and ``token_ids_logprob``. A simulated radix cache reports
``cached_tokens`` (the longest prefix shared with an earlier request, capped at
``logprob_start_len``). ``faults`` injects failures, one per request:
"500", "truncate" (a cut JSON body), "drop" (close without answering).

``StandInSpecServer`` stands in for a STANDALONE speculative server (the
``sglang_threshold`` method): it generates whole responses with the threshold
rule (``relaxtune.engine`` on a drafter/verifier pair, the rule checked against
SGLang's kernel in the tests), reports the speculative counters under one
chosen generation of SGLang's key names, and serves ``GET /server_info``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from ..backends.hf import _common_prefix

__all__ = ["StandInServer", "StandInSpecServer"]


def _top(logprobs: torch.Tensor, k: int) -> list:
    vals, ids = logprobs.topk(min(k, logprobs.shape[-1]))
    return [[float(v), int(i), None] for v, i in zip(vals, ids)]


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
    """

    def __init__(self, model, port: int = 0) -> None:
        self.model = model.eval()
        self.faults: list[str] = []
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
                elif self.path == "/server_info" and server.server_info() is not None:
                    self._send(200, json.dumps(server.server_info()).encode(), "application/json")
                else:
                    self._send(404, b"not found")

            def do_POST(self):
                if self.path != "/generate":
                    return self._send(404, b"not found")
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._count:
                    server.requests += 1
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
                    body = json.dumps(server.answer(payload)).encode()
                except ValueError as err:
                    return self._send(400, str(err).encode())
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

    def start(self) -> "StandInServer":
        """Serve in a background thread."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (a client then sees connection errors)."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def server_info(self) -> dict | None:
        """``GET /server_info`` (a plain server: no speculative flags)."""
        return {"speculative_algorithm": None, "speculative_num_steps": None,
                "speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0}

    def answer(self, payload: dict) -> dict:
        """The response body for a ``/generate`` payload."""
        ids = [int(t) for t in payload["input_ids"]]
        sp = payload.get("sampling_params", {})
        if sp.get("max_new_tokens") != 1 or sp.get("temperature") != 0:
            raise ValueError("the stand-in serves one-token greedy requests only")
        start = int(payload.get("logprob_start_len", len(ids) - 1))
        k = int(payload.get("top_logprobs_num", 0))
        extra_ids = payload.get("token_ids_logprob") or []
        with torch.inference_mode(), self._lock:
            lp = self.model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
            cached = max((_common_prefix(ids, list(s)) for s in self.seen), default=0)
            self.seen.append(tuple(ids))
        tok, top, by_id = [], [], []
        for j, pos in enumerate(range(start, len(ids))):
            if j == 0:
                tok.append([None, ids[pos], None])
                top.append(None)
                by_id.append(None)
                continue
            row = lp[pos - 1]
            tok.append([float(row[ids[pos]]), ids[pos], None])
            top.append(_top(row, k))
            by_id.append([[float(row[t]), int(t), None] for t in extra_ids])
        last = lp[-1]
        nxt = int(last.argmax())
        return {
            "text": "",
            "output_ids": [nxt],
            "meta_info": {
                "id": f"req-{self.requests}",
                "finish_reason": {"type": "length", "length": 1},
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "cached_tokens": min(cached, start),
                "input_token_logprobs": tok,
                "input_top_logprobs": top,
                "input_token_ids_logprobs": by_id if extra_ids else None,
                "output_token_logprobs": [[float(last[nxt]), nxt, None]],
                "output_top_logprobs": [_top(last, k)],
            },
        }


class StandInSpecServer(StandInServer):
    """A stand-in STANDALONE speculative server running ``sglang_threshold`` at
    ``(threshold, n_draft)`` with ``drafter`` inside ``verifier``'s server.

    Args:
        keys: the (accepted, proposed) counter names to report, one generation of
            ``relaxtune.backends.sglang_native.TELEMETRY_KEYS`` (or any pair, to
            mimic a future rename).
    """

    SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "sampling_seed")

    def __init__(self, drafter, verifier, threshold: float, n_draft: int,
                 keys: tuple[str, str] = ("spec_num_correct_drafts", "spec_num_proposed_drafts"), port: int = 0) -> None:
        from ..backends.hf import HFBackend

        super().__init__(verifier, port)
        self.pair = HFBackend(drafter, verifier, name="stand-in")
        self.threshold, self.n_draft, self.keys = float(threshold), int(n_draft), keys
        self.payloads: list[dict] = []

    def server_info(self) -> dict:
        return {"speculative_algorithm": "STANDALONE", "speculative_num_steps": self.n_draft,
                "speculative_eagle_topk": 1, "speculative_num_draft_tokens": self.n_draft + 1,
                "speculative_accept_threshold_single": self.threshold, "speculative_accept_threshold_acc": self.threshold}

    def answer(self, payload: dict) -> dict:
        """A whole response with the threshold rule; every sampling parameter must be explicit."""
        from ..engine import generate
        from ..sampling import SamplingParams

        sp = payload.get("sampling_params", {})
        missing = [k for k in self.SAMPLING_KEYS if k not in sp]
        if missing:  # the real server would fill them from the model's generation_config
            raise ValueError(f"sampling parameters left to the server's defaults: {missing}")
        self.payloads.append(payload)
        ids = [int(t) for t in payload["input_ids"]]
        top_k = int(sp["top_k"])
        sampling = SamplingParams(float(sp["temperature"]), top_k if top_k > 0 else None, float(sp["top_p"]))
        with self._lock:
            out = generate(self.pair, ids, method="sglang_threshold", knob=self.threshold, n_draft=self.n_draft,
                           sampling=sampling, max_new_tokens=int(sp["max_new_tokens"]), seed=int(sp["sampling_seed"]))
        s = out.stats
        return {
            "text": out.text,
            "output_ids": out.token_ids,
            "meta_info": {
                "id": f"req-{self.requests}",
                "finish_reason": {"type": "length" if s.finish_reason == "length" else "stop"},
                "prompt_tokens": len(ids), "completion_tokens": s.response_tokens, "cached_tokens": 0,
                "spec_verify_ct": s.rounds, self.keys[0]: s.accepted, self.keys[1]: s.drafted,
            },
        }
