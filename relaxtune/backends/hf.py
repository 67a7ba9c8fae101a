"""In-process transformers backend: drafter and verifier with KV caches.

Each sequence owns one ``DynamicCache`` per model and remembers which tokens each
cache holds. A forward feeds only the tokens a cache lacks. After a round,
``commit`` crops both caches back to the longest prefix they share with the
committed sequence (never recomputing from scratch), keeping at least the last
committed token uncached so the next forward has a query. The drafter therefore
feeds the previous round's last draft together with the new token when a round
accepted everything.

Batches (the protocol of ``relaxtune.backends.base``): every row of a ``Batch`` shares one ragged cache per
model (``relaxtune.backends.ragged``); a drafting step, a scoring pass or an AR
step is one forward for all rows, the same rollback rule applies row by row,
and rows join (prefilled alone) and leave at any round. On this project's
2-core CPU a forward's cost is mostly reading the weights, so 8 rows score 5
tokens each for about 2.6 times the cost of one (``BATCH_SIZE_CPU``).

Models are loaded once per process (``load_pair`` is cached on ids, dtype and
device).
"""

from __future__ import annotations

import functools
import os
import platform
import time
from collections.abc import Callable, Sequence

import torch

from ..decoding.serving import ServingProfile
from ..decoding.speed import MAX_PASSES, MIN_PASSES
from .base import DraftResult, Pick, SequenceState
from .costs import check_batch_sizes, measure_profile
from .hf_batch import BatchedForwards, common_prefix
from .lookup import PromptLookupBackend
from .naming import pair_name, parse_lookup
from .ragged import PrefillStore, supports

__all__ = ["HFBackend", "load_pair", "resolve_model_path", "default_batch_size", "BATCH_SIZE_CPU", "BATCH_SIZE_GPU"]

BATCH_SIZE_CPU = 8  # the fastest measured on the project's 2-core CPU (python -m relaxtune.bench.engine)
BATCH_SIZE_GPU = 32


def default_batch_size(device: torch.device | str) -> int:
    """Sequences per batch when none is given: ``BATCH_SIZE_GPU`` on CUDA, else ``BATCH_SIZE_CPU``."""
    return BATCH_SIZE_GPU if torch.device(device).type == "cuda" else BATCH_SIZE_CPU


def _crop(cache, length: int) -> None:
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class HFBackend(BatchedForwards):
    """A transformers drafter/verifier pair (CPU or one GPU).

    Args:
        drafter: a causal LM (or None for AR-only use).
        verifier: a causal LM with the same vocabulary width as the drafter.
        tokenizer: the shared tokenizer (used for ``decode`` and EOS ids).
        name: description for records (model ids).
        batch_size: the most sequences ``relaxtune.tune.evaluation.evaluate`` runs at
            once (``default_batch_size`` of the device when None); 1 or a model
            with sliding-window layers runs one sequence at a time.

    Raises:
        ValueError: when the two models' logit widths differ, or batch_size < 1.
    """

    point_mass_drafts = False  # the protocol's attributes (relaxtune.backends.base.Backend)
    native = None

    def __init__(self, drafter, verifier, tokenizer=None, name: str = "hf", batch_size: int | None = None) -> None:
        self.drafter = drafter.eval() if drafter is not None else None
        self.verifier = verifier.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = int(verifier.get_output_embeddings().weight.shape[0])
        if drafter is not None:
            width = int(drafter.get_output_embeddings().weight.shape[0])
            if width != self.vocab_size:
                raise ValueError(
                    f"drafter and verifier must share a vocabulary: logit widths {width} vs {self.vocab_size}"
                )
        eos = set()
        for source in (verifier.generation_config, verifier.config, tokenizer):
            ids = getattr(source, "eos_token_id", None) if source is not None else None
            if ids is not None:
                eos.update([ids] if isinstance(ids, int) else ids)
        self.eos_token_ids = frozenset(int(i) for i in eos)
        self.device = next(verifier.parameters()).device
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.ragged = all(supports(m) for m in (drafter, verifier) if m is not None)
        self.batch_size = (batch_size or default_batch_size(self.device)) if self.ragged else 1
        self.prefill_stores = {"v": PrefillStore(), "d": PrefillStore()}  # prompt prefills reused across batches

    # ---------------------------------------------------------------- protocol

    def start(self, prompt_ids: Sequence[int]) -> SequenceState:
        """A fresh state with empty caches (the first forward prefills the prompt).

        Raises:
            ValueError: empty prompt.
        """
        from transformers import DynamicCache

        if len(prompt_ids) == 0:
            raise ValueError("the prompt must hold at least one token")
        state = SequenceState(tokens=[int(t) for t in prompt_ids], prompt_len=len(prompt_ids))
        state.extra["v_cache"] = DynamicCache(config=self.verifier.config)
        state.extra["v_fed"] = []
        if self.drafter is not None:
            state.extra["d_cache"] = DynamicCache(config=self.drafter.config)
            state.extra["d_fed"] = []
        return state

    def _forward(self, model, cache, ids: list[int], keep: int) -> torch.Tensor:
        with torch.inference_mode():
            out = model(
                input_ids=torch.tensor([ids], device=self.device), cache=cache, use_cache=True, logits_to_keep=keep
            )
        return out.logits[0, -keep:].float().cpu()  # the rules run on CPU rows

    def draft(self, state: SequenceState, n: int, pick: Pick, extra_step: bool = False) -> DraftResult:
        """Draft ``n`` tokens, one drafter forward each (the first also feeds any
        committed tokens the cache lacks); ``extra_step`` adds the row after the
        last draft. Returns ids and raw logits ``[n(+1), V]`` (float32)."""
        if self.drafter is None:
            raise RuntimeError("this backend has no drafter (AR only)")
        cache, fed = state.extra["d_cache"], state.extra["d_fed"]
        feed = state.tokens[len(fed) :]
        ids: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(n + int(extra_step)):
            t0 = time.perf_counter()
            row = self._forward(self.drafter, cache, feed, 1)[0]
            state.draft_seconds += time.perf_counter() - t0
            state.draft_forwards += 1
            state.draft_tokens_fed += len(feed)
            fed.extend(feed)
            rows.append(row)
            if i < n:
                ids.append(int(pick(row)))
                feed = [ids[-1]]
        return DraftResult(ids, torch.stack(rows))

    def score(self, state: SequenceState, draft_ids: Sequence[int]) -> torch.Tensor:
        """Verifier raw logits ``[N+1, V]`` (float32) in one forward pass."""
        cache, fed = state.extra["v_cache"], state.extra["v_fed"]
        feed = state.tokens[len(fed) :] + [int(t) for t in draft_ids]
        t0 = time.perf_counter()
        logits = self._forward(self.verifier, cache, feed, len(draft_ids) + 1)
        state.verify_seconds += time.perf_counter() - t0
        state.verify_forwards += 1
        state.verify_tokens_fed += len(feed)
        fed.extend(feed)
        return logits

    def step(self, state: SequenceState) -> torch.Tensor:
        """Verifier raw logits ``[V]`` (float32) for the next token."""
        return self.score(state, [])[0]

    def commit(self, state: SequenceState, tokens: Sequence[int]) -> None:
        """Append ``tokens``; crop each cache to the prefix it shares with the
        sequence, leaving the last token uncached."""
        before = len(state.tokens)
        state.tokens.extend(int(t) for t in tokens)
        limit = len(state.tokens) - 1
        for cache_key, fed_key in (("v_cache", "v_fed"), ("d_cache", "d_fed")):
            if cache_key not in state.extra:
                continue
            fed = state.extra[fed_key]
            keep = min(common_prefix(fed, state.tokens, before), limit)
            del fed[keep:]
            _crop(state.extra[cache_key], keep)

    def cost_profile(
        self,
        prompt_ids: Sequence[int],
        n_drafts: Sequence[int],
        batch_sizes: Sequence[int] = (1,),
        min_passes: int = MIN_PASSES,
        max_passes: int = MAX_PASSES,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> ServingProfile:
        """Forward costs on this machine at each serving batch size B
        (``relaxtune.backends.costs.measure_profile``): per model and B, a ``DynamicCache``
        of B rows, each the prompt plus 64 tokens (prefilled once, its rows repeated,
        ``DynamicCache.batch_repeat_interleave``); a timed forward feeds every row the
        same k tokens (``[B, k]``, logits of all B x k positions to the CPU, as a round
        reads them) and crops the cache back after it.

        Raises:
            ValueError: bad batch sizes (``check_batch_sizes``).
        """
        from transformers import DynamicCache

        sizes = check_batch_sizes(batch_sizes)
        ctx = [int(t) for t in prompt_ids] + [int(t) % self.vocab_size for t in range(64)]
        models = {"verify": self.verifier} | ({"draft": self.drafter} if self.drafter is not None else {})
        caches = {}
        for name, model in models.items():
            for b in sizes:
                cache = DynamicCache(config=model.config)
                self._forward(model, cache, ctx, 1)
                if b > 1:
                    cache.batch_repeat_interleave(b)
                caches[(name, b)] = cache
        base = len(ctx)

        def job(name: str, k: int, b: int):
            model, cache = models[name], caches[(name, b)]
            ids = torch.tensor([ctx[-k:]] * b, device=self.device)

            def run() -> None:
                with torch.inference_mode():
                    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=k)
                out.logits[:, -k:].float().cpu()
                _crop(cache, base)

            return run

        return measure_profile(
            job,
            n_drafts,
            sizes,
            "draft" in models,
            f"{self.name} on {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
            min_passes,
            max_passes,
            clock=clock,
        )

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids to text (``skip_special_tokens``); ids as text without a tokenizer."""
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


# ------------------------------------------------------------------- loading


def resolve_model_path(model_id: str) -> str:
    """A loadable path for ``model_id``: an embedded model name (converted once
    into the cache), else the id itself (local folder or hub id).

    Raises:
        FileNotFoundError: ``model_id`` looks like a local path but is no folder.
    """
    from .embedded import EMBEDDED, ensure_converted

    if model_id in EMBEDDED:
        return str(ensure_converted(EMBEDDED[model_id]))
    looks_local = model_id.startswith((".", "/", "~")) or os.path.exists(model_id)
    if looks_local:
        path = os.path.abspath(os.path.expanduser(model_id))
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"no model folder {path} (give a folder with config.json, a hub id, or an "
                f"embedded name: {', '.join(EMBEDDED)})"
            )
        return path
    return model_id


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_pair(
    drafter: str | None, verifier: str, dtype: str = "bfloat16", device: str = "auto", batch_size: int | None = None
) -> HFBackend | PromptLookupBackend:
    """Load (once per process) a drafter/verifier pair into an ``HFBackend``.

    Args:
        drafter: model id or path, an embedded name, ``prompt-lookup[:<max n>]`` (a
            ``relaxtune.backends.lookup.PromptLookupBackend`` over the verifier), or
            None (AR only).
        verifier: model id or path, or an embedded name.
        dtype: torch dtype name ("bfloat16" is fastest on CPUs measured so far;
            "float32" for exact comparisons).
        device: "cpu", "cuda", "cuda:1", ... or "auto" (cuda when available).
        batch_size: sequences an evaluation runs at once (None: ``default_batch_size``).

    Raises:
        ValueError: when the two tokenizers differ (speculative decoding needs the
            same token ids), or the dtype is unknown.
    """
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"unknown dtype {dtype!r}; use bfloat16, float16 or float32")
    if (max_ngram := parse_lookup(drafter)) is not None:  # a drafter without a model: the verifier alone, wrapped
        verifier_only = load_pair(None, verifier, dtype=dtype, device=device, batch_size=batch_size)
        return PromptLookupBackend(verifier_only, max_ngram=max_ngram, name=pair_name(drafter, verifier, dtype))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    v_path = resolve_model_path(verifier)
    tok = _tokenizer(v_path)
    d_model, d_path = None, None
    if drafter is not None:
        d_path = resolve_model_path(drafter)
        if d_path != v_path and _tokenizer(d_path).get_vocab() != tok.get_vocab():
            raise ValueError(
                f"drafter {drafter!r} and verifier {verifier!r} have different tokenizers; "
                "speculative decoding needs a shared vocabulary"
            )
        d_model = _load(d_path, dtype, device)
    return HFBackend(
        d_model, _load(v_path, dtype, device), tok, name=pair_name(drafter, verifier, dtype), batch_size=batch_size
    )
