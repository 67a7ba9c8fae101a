"""Which backend a job runs on: two SGLang servers when both URLs are given, else the
in-process pair; and the name its records and studies carry, known without loading."""

from __future__ import annotations

from .lookup import PromptLookupBackend, parse_lookup

__all__ = ["backend_name", "load_backend"]


def backend_name(drafter: str, verifier: str, dtype: str = "bfloat16", drafter_url: str | None = None,
                 verifier_url: str | None = None, **loading) -> str:
    """The name ``load_backend`` gives its backend (records and study names carry it),
    without loading anything: ``sglang-<drafter>-><verifier>`` for servers, else the
    in-process pair's ``pair_name``. ``loading``: ``load_backend``'s other arguments,
    which do not change the name (so one dict serves both)."""
    if verifier_url and (drafter_url or parse_lookup(drafter) is not None):
        return f"sglang-{drafter}->{verifier}"
    from .hf import pair_name

    return pair_name(drafter, verifier, dtype)


def load_backend(drafter: str, verifier: str, *, dtype: str = "bfloat16", batch_size: int | None = None,
                 drafter_url: str | None = None, verifier_url: str | None = None, tokenizer: str | None = None,
                 concurrency: int = 8, native_url: str | None = None):
    """The SGLang backend when both server URLs are set, else the in-process pair
    (``hf.load_pair``: ``batch_size`` sequences together). The prompt-lookup drafter
    (``--drafter prompt-lookup``, ``relaxtune.backends.lookup``) needs no model: over
    SGLang it takes the verifier's URL alone.

    Raises:
        ValueError: only one of the two URLs is set (a drafter URL with prompt lookup),
            or ``native_url`` without them (or with prompt lookup).
        relaxtune.backends.sglang.SGLangError: a server is unreachable.
    """
    max_ngram = parse_lookup(drafter)
    if max_ngram is not None and drafter_url:
        raise ValueError(f"--drafter {drafter} drafts without a model: give --verifier-url alone, no --drafter-url")
    if max_ngram is None and bool(drafter_url) != bool(verifier_url):
        raise ValueError("the SGLang backend needs both --drafter-url and --verifier-url")
    if native_url and not verifier_url:
        raise ValueError("--native-url needs --drafter-url and --verifier-url too (strict, the baseline, runs on them)")
    if native_url and max_ngram is not None:
        raise ValueError("--native-url serves SGLang's speculative server with its own drafter model, not prompt lookup")
    if verifier_url:
        from .sglang import SGLangBackend

        name = backend_name(drafter, verifier, dtype, drafter_url, verifier_url)
        backend = SGLangBackend(drafter_url, verifier_url, tokenizer or verifier, max_concurrency=concurrency,
                                native_url=native_url, name=name)
        return backend if max_ngram is None else PromptLookupBackend(backend, max_ngram=max_ngram, name=name)
    from .hf import load_pair

    return load_pair(drafter, verifier, dtype=dtype, batch_size=batch_size)
