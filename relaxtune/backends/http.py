"""HTTP to SGLang servers: one shared async client and a ``/generate`` caller
with retries. Used by the two-server backend (``relaxtune.backends.sglang``)
and the native speculative server (``relaxtune.backends.sglang_native``).

- All HTTP goes through one ``httpx.AsyncClient`` on a private event loop
  (``AsyncHTTP``), at most ``max_concurrency`` requests in flight (an
  ``asyncio.Semaphore``).
- Transient faults (connection errors, timeouts, 5xx, a truncated body) are
  retried with exponential backoff; anything else, and a fault that outlives the
  retries, raises ``SGLangError`` naming the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading

import httpx

__all__ = ["SGLangError", "AsyncHTTP", "ServerClient"]


class SGLangError(RuntimeError):
    """A request to an SGLang server failed for good (after retries) or returned
    something we cannot read; the message names the server and the field."""


class AsyncHTTP:
    """One ``httpx.AsyncClient`` on a private event-loop thread, shared by every
    server of a backend. Synchronous callers (the engine, from ``evaluate``'s
    threads) submit coroutines with ``run``; at most ``max_concurrency`` requests
    are in flight at once (an ``asyncio.Semaphore``).

    Args:
        timeout: seconds per request.
        max_concurrency: requests in flight at most.
    """

    def __init__(self, timeout: float = 120.0, max_concurrency: int = 8) -> None:
        self.closed, self.timeout = False, timeout
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="relaxtune-sglang-http", daemon=True)
        self.thread.start()

        async def make():
            limits = httpx.Limits(max_connections=max_concurrency + 2)
            return httpx.AsyncClient(timeout=timeout, limits=limits), asyncio.Semaphore(max_concurrency)

        self.client, self.semaphore = self.run(make())

    def run(self, coro):
        """Run ``coro`` on the loop and wait for its result (its exceptions propagate).

        Raises:
            SGLangError: the client is closed, or was closed while waiting.
        """
        if self.closed:
            coro.close()
            raise SGLangError("the SGLang backend's HTTP client is closed")
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        except concurrent.futures.CancelledError:
            raise SGLangError("the SGLang backend's HTTP client was closed during the request") from None

    async def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        """One request, waiting for a free slot first."""
        async with self.semaphore:
            return await self.client.request(method, url, **kwargs)

    def close(self) -> None:
        """Cancel requests in flight (their callers get ``SGLangError``), close the
        client, stop and close the loop. Idempotent."""
        if self.closed:
            return
        self.closed = True

        async def shutdown():
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self.client.aclose()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class ServerClient:
    """``/generate`` and ``/health`` of one server, with retries.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:30000``.
        role: "drafter" or "verifier" (for messages).
        http: the backend's shared ``AsyncHTTP``.
        retries: attempts after the first for transient faults.
        backoff: first backoff in seconds (doubles each retry).
    """

    def __init__(self, url: str, role: str, http: AsyncHTTP, retries: int = 3, backoff: float = 0.5) -> None:
        self.url, self.role, self.http = url.rstrip("/"), role, http
        self.retries, self.backoff = retries, backoff

    def __str__(self) -> str:
        return f"{self.role} server at {self.url}"

    def get_json(self, path: str, timeout: float = 30.0) -> dict:
        """``GET path`` as JSON (no retries).

        Raises:
            SGLangError: unreachable, not 200, or not JSON.
        """
        try:
            r = self.http.run(self.http.request("GET", f"{self.url}{path}", timeout=timeout))
            if r.status_code != 200:
                raise SGLangError(f"{self}: GET {path} answered HTTP {r.status_code}")
            return r.json()
        except (httpx.HTTPError, ValueError) as err:
            raise SGLangError(f"{self}: GET {path} failed: {type(err).__name__}: {err}") from None

    def health(self) -> None:
        """Raise ``SGLangError`` unless ``GET /health`` answers 200."""
        try:
            r = self.http.run(self.http.request("GET", f"{self.url}/health", timeout=10))
        except httpx.HTTPError as err:
            raise SGLangError(
                f"{self} is unreachable: {type(err).__name__}: {err}; check the URL, or start the "
                "servers (`relaxtune serve`, see the README's SGLang section)"
            ) from None
        if r.status_code != 200:
            raise SGLangError(f"{self} is not healthy: HTTP {r.status_code}")

    def generate(self, payload: dict) -> dict:
        """POST ``/generate``; retry transient faults; return the JSON body."""
        return self.http.run(self.agenerate(payload))

    async def agenerate(self, payload: dict) -> dict:
        """``generate`` as a coroutine on the backend's loop."""
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                r = await self.http.request("POST", f"{self.url}/generate", json=payload)
            except (httpx.TransportError, httpx.TimeoutException) as err:
                last = f"{type(err).__name__}: {err}"
                continue
            if r.status_code >= 500:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code != 200:
                raise SGLangError(f"{self} refused the request: HTTP {r.status_code}: {r.text[:300]}")
            try:
                body = r.json()
            except (json.JSONDecodeError, ValueError):
                last = f"malformed JSON body ({len(r.content)} bytes)"
                continue
            if isinstance(body, list):
                body = body[0]
            return body
        raise SGLangError(f"{self} failed after {self.retries + 1} attempts: {last}")
