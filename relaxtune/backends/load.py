"""Which backend a job runs on: two SGLang servers when both URLs are given, else the
in-process pair (transformers, or llama.cpp on GGUF files with ``runtime="llamacpp"``);
and the name its records and studies carry, known without loading."""

from __future__ import annotations

__all__ = ["backend_name", "load_backend", "RUNTIMES"]

RUNTIMES = ("hf", "llamacpp")  # the in-process backends: transformers, llama.cpp


def backend_name(drafter: str, verifier: str, dtype: str = "bfloat16", drafter_url: str | None = None,
                 verifier_url: str | None = None, runtime: str = "hf", **loading) -> str:
    """The name ``load_backend`` gives its backend (records and study names carry it),
    without loading anything: ``sglang-<drafter>-><verifier>`` for servers, else the
    in-process pair's ``pair_name`` (on llama.cpp ``gguf_pair_name``, ending ``@llamacpp``).
    ``loading``: ``load_backend``'s other arguments, which do not change the name (so one
    dict serves both)."""
    if drafter_url and verifier_url:
        return f"sglang-{drafter}->{verifier}"
    if runtime == "llamacpp":
        from .llamacpp import gguf_pair_name

        return gguf_pair_name(drafter, verifier)
    from .hf import pair_name

    return pair_name(drafter, verifier, dtype)


def load_backend(drafter: str, verifier: str, *, dtype: str = "bfloat16", batch_size: int | None = None,
                 drafter_url: str | None = None, verifier_url: str | None = None, tokenizer: str | None = None,
                 concurrency: int = 8, native_url: str | None = None, runtime: str = "hf"):
    """The SGLang backend when both server URLs are set, else the in-process pair:
    ``hf.load_pair`` (``runtime="hf"``), or ``llamacpp.load_gguf_pair`` on GGUF files
    (``runtime="llamacpp"``; ``tokenizer`` overrides the GGUF's), ``batch_size``
    sequences together.

    Raises:
        ValueError: only one of the two URLs is set, ``native_url`` without them, or
            an unknown runtime.
        relaxtune.backends.sglang.SGLangError: a server is unreachable.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; use one of {', '.join(RUNTIMES)}")
    if bool(drafter_url) != bool(verifier_url):
        raise ValueError("the SGLang backend needs both --drafter-url and --verifier-url")
    if native_url and not verifier_url:
        raise ValueError("--native-url needs --drafter-url and --verifier-url too (strict, the baseline, runs on them)")
    if verifier_url:
        from .sglang import SGLangBackend

        return SGLangBackend(drafter_url, verifier_url, tokenizer or verifier, max_concurrency=concurrency,
                             native_url=native_url, name=backend_name(drafter, verifier, dtype, drafter_url, verifier_url))
    if runtime == "llamacpp":
        from .llamacpp import load_gguf_pair

        return load_gguf_pair(drafter, verifier, batch_size, tokenizer=tokenizer)
    from .hf import load_pair

    return load_pair(drafter, verifier, dtype=dtype, batch_size=batch_size)
