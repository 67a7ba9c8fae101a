"""Which backend a job runs on: two SGLang servers when both URLs are given, else the
in-process pair; and the name its records and studies carry, known without loading."""

from __future__ import annotations

from importlib import util

from .lookup import PromptLookupBackend
from .naming import gguf_pair_name, pair_name, parse_lookup, server_pair_name

__all__ = ["backend_name", "load_backend", "resolve_runtime", "RUNTIMES", "AUTO"]

RUNTIMES = ("hf", "llamacpp")  # the in-process backends: transformers, llama.cpp
AUTO = "auto"  # llama.cpp for the embedded pair when installed, else transformers (resolve_runtime)


def resolve_runtime(
    runtime: str, drafter: str | None, verifier: str, drafter_url: str | None = None, verifier_url: str | None = None
) -> str:
    """The in-process runtime a job runs on: ``runtime`` itself, or for ``"auto"``
    llama.cpp (``"llamacpp"``) when the models are the embedded pair's (the drafter may
    be None, AR, or prompt lookup, no model), no SGLang server is named and
    llama-cpp-python is installed, else transformers (``"hf"``). On the embedded pair
    llama.cpp decodes its GGUF files about 3x faster per AR token than transformers
    on their bfloat16 copies on a 2-core CPU (README, Performance) and needs no conversion.

    Raises:
        ValueError: an unknown runtime, a malformed ``prompt-lookup:<n>`` drafter, or
            llama.cpp asked for with SGLang servers named (they run the models;
            nothing would run on llama.cpp).
    """
    lookup = parse_lookup(drafter) is not None  # first: a malformed lookup name is refused on every runtime
    if runtime != AUTO:
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown runtime {runtime!r}; use one of {AUTO}, {', '.join(RUNTIMES)}")
        if runtime == "llamacpp" and (drafter_url or verifier_url):
            raise ValueError(
                "--runtime llamacpp runs the models in-process, and --drafter-url/--verifier-url run "
                "them on SGLang servers: give one or the other"
            )
        return runtime
    from .embedded import EMBEDDED

    embedded = verifier in EMBEDDED and (drafter is None or drafter in EMBEDDED or lookup)
    if embedded and not (drafter_url or verifier_url) and util.find_spec("llama_cpp") is not None:
        return "llamacpp"
    return "hf"


def backend_name(
    drafter: str,
    verifier: str,
    dtype: str = "bfloat16",
    drafter_url: str | None = None,
    verifier_url: str | None = None,
    runtime: str = "hf",
    **loading,
) -> str:
    """The name ``load_backend`` gives its backend (records and study names carry it),
    without loading anything: ``sglang-<drafter>-><verifier>`` for servers, else the
    in-process pair's ``pair_name`` (on llama.cpp ``gguf_pair_name``, ending ``@llamacpp``).
    ``loading``: ``load_backend``'s other arguments, which do not change the name (so one
    dict serves both)."""
    if verifier_url and (drafter_url or parse_lookup(drafter) is not None):
        return server_pair_name(drafter, verifier)
    if runtime == "llamacpp":
        return gguf_pair_name(drafter, verifier)
    return pair_name(drafter, verifier, dtype)


def load_backend(
    drafter: str,
    verifier: str,
    *,
    dtype: str = "bfloat16",
    batch_size: int | None = None,
    drafter_url: str | None = None,
    verifier_url: str | None = None,
    tokenizer: str | None = None,
    concurrency: int = 8,
    native_url: str | None = None,
    runtime: str = "hf",
):
    """The SGLang backend when both server URLs are set, else the in-process pair:
    ``hf.load_pair`` (``runtime="hf"``), or ``llamacpp.load_gguf_pair`` on GGUF files
    (``runtime="llamacpp"``; ``tokenizer`` overrides the GGUF's), ``batch_size``
    sequences together. The prompt-lookup drafter
    (``--drafter prompt-lookup``, ``relaxtune.backends.lookup``) needs no model: it
    wraps the verifier alone, in-process on either runtime or over SGLang (the
    verifier's URL alone).

    Raises:
        ValueError: only one of the two URLs is set (a drafter URL with prompt lookup),
            ``native_url`` without them (or with prompt lookup), or an unknown runtime.
        relaxtune.backends.sglang.SGLangError: a server is unreachable, or serves another
            model than ``drafter`` / ``verifier`` names (its ``/model_info``).
    """
    runtime = resolve_runtime(runtime, drafter, verifier, drafter_url, verifier_url)
    max_ngram = parse_lookup(drafter)
    if max_ngram is not None and drafter_url:
        raise ValueError(f"--drafter {drafter} drafts without a model: give --verifier-url alone, no --drafter-url")
    if max_ngram is None and bool(drafter_url) != bool(verifier_url):
        raise ValueError("the SGLang backend needs both --drafter-url and --verifier-url")
    if native_url and not verifier_url:
        raise ValueError("--native-url needs --drafter-url and --verifier-url too (strict, the baseline, runs on them)")
    if native_url and max_ngram is not None:
        raise ValueError(
            "--native-url serves SGLang's speculative server with its own drafter model, not prompt lookup"
        )
    if verifier_url:
        from .embedded import EMBEDDED
        from .hf import resolve_model_path
        from .sglang import SGLangBackend

        tokenizer = tokenizer or verifier
        if tokenizer in EMBEDDED:  # its converted folder holds the tokenizer and configs
            tokenizer = resolve_model_path(tokenizer)
        name = backend_name(drafter, verifier, dtype, drafter_url, verifier_url)
        backend = SGLangBackend(
            drafter_url,
            verifier_url,
            tokenizer,
            max_concurrency=concurrency,
            native_url=native_url,
            name=name,
            models=(drafter if max_ngram is None else None, verifier),
        )
        return backend if max_ngram is None else PromptLookupBackend(backend, max_ngram=max_ngram, name=name)
    if runtime == "llamacpp":
        from .llamacpp import load_gguf_pair

        if max_ngram is not None:  # a drafter without a model: the verifier's GGUF alone, wrapped
            verifier_only = load_gguf_pair(None, verifier, batch_size, tokenizer=tokenizer)
            return PromptLookupBackend(
                verifier_only, max_ngram=max_ngram, name=backend_name(drafter, verifier, runtime=runtime)
            )
        return load_gguf_pair(drafter, verifier, batch_size, tokenizer=tokenizer)
    from .hf import load_pair

    return load_pair(drafter, verifier, dtype=dtype, batch_size=batch_size)


class LazyBackend:
    """A backend that loads on first use: its ``name`` is known before (``backend_name``),
    so work that only reads records (``relaxtune export``, ``relaxtune eval`` when every
    sample is recorded) never loads a model. Every other member of the protocol
    (``relaxtune.backends.base.Backend``) and of what a job reads (``tokenizer``,
    ``device``, ``runtime``, ``max_concurrency``, ``cost_profile``) loads the backend
    and is the loaded one's; ``native`` (the SGLang speculative server) is None
    without a ``native_url``; ``close`` closes only a loaded backend.

    Args:
        load: loads the backend (e.g. ``lambda: load_backend(**kwargs)``).
        name: the name the loaded backend will have.
        native: whether the loaded backend has a native speculative server.
    """

    def __init__(self, load, name: str, native: bool = False) -> None:
        self.name, self._load, self._native, self._backend = name, load, native, None

    def cost_profile(self, *args, **kwargs):
        """The loaded backend's ``cost_profile`` (every backend ``load_backend`` makes measures
        its costs: in process, or through the SGLang servers)."""
        return self.backend.cost_profile(*args, **kwargs)

    @property
    def loaded(self) -> bool:
        """Whether the backend was loaded."""
        return self._backend is not None

    @property
    def backend(self):
        """The loaded backend (loading it now when not yet)."""
        if self._backend is None:
            self._backend = self._load()
        return self._backend

    @property
    def native(self):
        """The loaded backend's native speculative server (None, unloaded, without one)."""
        return self.backend.native if self._native else None

    vocab_size = property(lambda self: self.backend.vocab_size, doc="The loaded backend's ``vocab_size``.")
    eos_token_ids = property(lambda self: self.backend.eos_token_ids, doc="The loaded backend's ``eos_token_ids``.")
    batch_size = property(lambda self: self.backend.batch_size, doc="The loaded backend's ``batch_size``.")
    point_mass_drafts = property(lambda self: self.backend.point_mass_drafts, doc="The loaded backend's.")
    tokenizer = property(lambda self: self.backend.tokenizer, doc="The loaded backend's ``tokenizer``.")
    device = property(lambda self: getattr(self.backend, "device", "cpu"), doc="The loaded backend's ``device``.")
    runtime = property(lambda self: getattr(self.backend, "runtime", None), doc="The loaded backend's ``runtime``.")
    max_concurrency = property(
        lambda self: getattr(self.backend, "max_concurrency", None),
        doc="The loaded backend's ``max_concurrency`` (SGLang), else None.",
    )

    def start_batch(self):
        """The loaded backend's ``start_batch``."""
        return self.backend.start_batch()

    def join(self, batch, prompts):
        """The loaded backend's ``join``."""
        return self.backend.join(batch, prompts)

    def leave(self, batch, rows) -> None:
        """The loaded backend's ``leave``."""
        self.backend.leave(batch, rows)

    def draft_batch(self, batch, n, pick, extra_step=False):
        """The loaded backend's ``draft_batch``."""
        return self.backend.draft_batch(batch, n, pick, extra_step=extra_step)

    def score_batch(self, batch, draft_ids):
        """The loaded backend's ``score_batch``."""
        return self.backend.score_batch(batch, draft_ids)

    def commit_batch(self, batch, tokens) -> None:
        """The loaded backend's ``commit_batch``."""
        self.backend.commit_batch(batch, tokens)

    def decode(self, ids) -> str:
        """The loaded backend's ``decode``."""
        return self.backend.decode(ids)

    def close(self) -> None:
        """Close the backend when it was loaded (an SGLang client), else nothing."""
        if self._backend is not None and hasattr(self._backend, "close"):
            self._backend.close()


def lazy_backend(**kwargs) -> LazyBackend:
    """``LazyBackend`` of ``load_backend(**kwargs)``, named by ``backend_name(**kwargs)``."""
    from . import load as module  # looked up at load time (tests replace load_backend)

    return LazyBackend(
        lambda: module.load_backend(**kwargs),
        backend_name(**kwargs),
        native=bool(kwargs.get("native_url")),
    )
