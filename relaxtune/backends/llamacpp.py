"""The llama.cpp backend: GGUF models decoded by llama.cpp, speculated by relaxtune.

``LlamaCppBackend`` serves the protocol of ``relaxtune.backends.base`` (a batch;
one sequence is a batch of one) on two ``LlamaModel`` contexts, one per
model. Every sequence owns a slot in each context (its own KV stream). A
drafting step feeds every row its next token in one ``llama_decode``; scoring
feeds every row its lacking token and its N drafts in one ``llama_decode`` and
reads full-vocabulary logits at all N + 1 positions; after a round each
context keeps, per row, the prefix it shares with the row's committed tokens
(``llama_memory_seq_rm`` drops the rest, the rule of ``HFBackend.commit``).
Rows join (their prompt prefilled) and leave at any round. The rules, the
sampling transform and the round's random numbers stay in
``relaxtune.engine``: this module only serves logits.

A batch runs as one llama.cpp forward when its rows feed as many tokens each
(see ``relaxtune.backends.llamacpp_model``). The verifier's rows always lack
one token; a drafter row lacks two after a round that accepted every draft,
so the first drafting step of a round rolls every other row back by one token
(recomputed, cheaper than a second forward).

Models load directly from GGUF files (the embedded pair's, no conversion, or any
file a user names); the tokenizer is read from the verifier's GGUF by
transformers (or given). Install: ``pip install 'relaxtune[llamacpp]'``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ..decoding.serving import ServingProfile
from ..decoding.speed import MAX_PASSES, MIN_PASSES
from .base import Batch, BatchPick, DraftResult, Pick, SequenceState
from .costs import check_batch_sizes, measure_profile
from .hf_batch import common_prefix
from .llamacpp_model import MAX_SEQUENCES, LlamaModel, release_free_memory
from .naming import LLAMACPP as RUNTIME
from .naming import gguf_pair_name

__all__ = [
    "LlamaCppBackend",
    "load_gguf_pair",
    "resolve_gguf",
    "context_cells",
    "BATCH_SIZE_LLAMACPP",
    "MAX_SEQUENCES",
]

BATCH_SIZE_LLAMACPP = 16  # sequences per batch by default (python -m relaxtune.bench.engine --backend llamacpp)
_PROFILE_TOKENS = 64  # the tokens cost_profile's slots hold past its prompt


def context_cells(prompt_tokens: int, max_new_tokens: int, n_draft: int) -> int:
    """KV cells per sequence that sequences of a task need, at most.

    A round starts on a sequence of fewer than ``prompt_tokens + max_new_tokens``
    tokens (one that reached the budget has ended) and feeds each context at most
    N positions past it (the verifier its drafts, the drafter its drafts and the
    extra step), so generation fills ``prompt_tokens + max_new_tokens - 1 + N``
    cells; ``cost_profile`` fills its prompt, 64 tokens and N + 1 more. The larger
    of the two (llama.cpp pads it to a multiple of 256).

    Args:
        prompt_tokens: the longest prompt (tokens, after the chat template).
        max_new_tokens: the task's budget (tokens, a thinking task's total).
        n_draft: the longest draft length N (0: plain decoding).

    Raises:
        ValueError: a count below 0, or a budget below 1.
    """
    if min(prompt_tokens, n_draft) < 0 or max_new_tokens < 1:
        raise ValueError(
            f"context_cells needs counts >= 0 and a budget >= 1 (prompt {prompt_tokens}, budget "
            f"{max_new_tokens}, N {n_draft})"
        )
    return prompt_tokens + n_draft + max(max_new_tokens - 1, _PROFILE_TOKENS + 1)


class LlamaCppBackend:
    """A drafter/verifier pair of GGUF models on llama.cpp (CPU).

    Args:
        drafter: the drafter's ``LlamaModel`` (None: AR only).
        verifier: the verifier's ``LlamaModel``.
        tokenizer: a transformers tokenizer of the pair (chat template, decode), or None.
        name: description for records.
        batch_size: the most sequences an evaluation runs at once (at most the
            contexts' slots).

    Raises:
        ValueError: the two vocabularies differ, or batch_size is outside [1, slots].
    """

    point_mass_drafts = False  # the protocol's attributes (relaxtune.backends.base.Backend)
    native = None

    runtime = RUNTIME  # what the job's time estimate prices batches with (relaxtune.tune.estimate)

    def __init__(
        self,
        drafter: LlamaModel | None,
        verifier: LlamaModel,
        tokenizer=None,
        name: str = RUNTIME,
        batch_size: int | None = None,
    ) -> None:
        self.drafter, self.verifier, self.tokenizer, self.name = drafter, verifier, tokenizer, name
        self.vocab_size = verifier.n_vocab
        if drafter is not None and drafter.token_texts() != verifier.token_texts():
            raise ValueError(
                f"drafter {drafter.path.name} and verifier {verifier.path.name} have different "
                "vocabularies; speculative decoding needs the same token ids"
            )
        self.eos_token_ids = verifier.end_ids()
        self.slots = slots = min(m.slots for m in self.models.values())  # the most any context is made with
        self.batch_size = int(batch_size or slots)
        if not 1 <= self.batch_size <= slots:
            raise ValueError(f"batch_size must lie in [1, {slots}] (the contexts' sequence slots), got {batch_size}")
        self.device = torch.device("cpu")

    @property
    def models(self) -> dict[str, LlamaModel]:
        """The contexts by key: "v" the verifier, "d" the drafter (when there is one)."""
        return {"v": self.verifier} | ({"d": self.drafter} if self.drafter is not None else {})

    def fit_context(self, prompt_tokens: int, max_new_tokens: int, n_draft: int, sequences: int | None = None) -> int:
        """Size each context's KV cache to what a task's sequences fill
        (``context_cells``) instead of ``n_ctx_seq`` cells each, and, with
        ``sequences``, to that many sequence slots (at most ``slots``) instead of
        ``slots``; before any sequence starts (the caches are made at their first
        use). ``cost_profile`` makes a context of its own, of ``slots`` sequences,
        while it measures. Returns the cells per sequence asked for.

        Args:
            prompt_tokens / max_new_tokens / n_draft: as ``context_cells``.
            sequences: the most sequences the task runs at once (a job: its problems
                x repeats x parallel trials); None: ``slots``.

        Raises:
            ValueError: as ``context_cells``; ``sequences`` < 1.
            RuntimeError: a sequence holds a slot.
        """
        cells = context_cells(prompt_tokens, max_new_tokens, n_draft)
        if sequences is not None and sequences < 1:
            raise ValueError(f"sequences must be >= 1, got {sequences}")
        slots = min(int(sequences), self.slots) if sequences is not None else self.slots
        for model in self.models.values():
            model.resize(cells, slots)
        return cells

    # ---------------------------------------------------------------- states

    def start(self, prompt_ids: Sequence[int]) -> SequenceState:
        """A fresh state holding a slot in each context (freed with the state, or by
        ``leave``); the first forward prefills the prompt.

        Raises:
            ValueError: empty prompt. RuntimeError: no free slot.
        """
        if len(prompt_ids) == 0:
            raise ValueError("the prompt must hold at least one token")
        state = SequenceState(tokens=[int(t) for t in prompt_ids], prompt_len=len(prompt_ids))
        slots = {}
        try:
            for key, model in self.models.items():
                slots[key] = model.acquire()
        except BaseException:
            for key, slot in slots.items():
                self.models[key].release(slot)
            raise
        state.extra["slots"] = slots
        for key in slots:
            state.extra[f"{key}_fed"] = []
        state.extra["release"] = weakref.finalize(state, _release, dict(self.models), dict(slots))
        return state

    def _forward(self, key: str, states: list[SequenceState], feeds: list[list[int]], keep: int) -> torch.Tensor:
        """One decode of model ``key`` over each row's feed; logits ``[R, keep, V]``.
        Each row is charged an equal share of the seconds."""
        model = self.models[key]
        t0 = time.perf_counter()
        out = model.decode(
            [(s.extra["slots"][key], len(s.extra[f"{key}_fed"]), f, keep) for s, f in zip(states, feeds)]
        )
        share = (time.perf_counter() - t0) / len(states)
        for s, f in zip(states, feeds):
            s.extra[f"{key}_fed"].extend(f)
            if key == "v":
                s.verify_seconds += share
                s.verify_forwards += 1
                s.verify_tokens_fed += len(f)
            else:
                s.draft_seconds += share
                s.draft_forwards += 1
                s.draft_tokens_fed += len(f)
        return out.view(len(states), keep, -1)

    def _lacking(self, key: str, states: list[SequenceState], equal: bool) -> list[list[int]]:
        """Per row, the committed tokens the ``key`` context lacks; with ``equal``,
        rows lacking fewer than the most are rolled back to lack as many (one
        llama.cpp forward for all) unless that would re-feed a whole prompt."""
        fed = [s.extra[f"{key}_fed"] for s in states]
        lack = [len(s.tokens) - len(f) for s, f in zip(states, fed)]
        most = max(lack)
        if equal and most <= 4:
            for s, f, n in zip(states, fed, lack):
                if n < most:
                    keep = len(s.tokens) - most
                    self.models[key].rollback(s.extra["slots"][key], keep)
                    del f[keep:]
        return [s.tokens[len(f) :] for s, f in zip(states, fed)]

    def _draft(self, states: list[SequenceState], n: int, pick, extra_step: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if self.drafter is None:
            raise RuntimeError("this backend has no drafter (AR only)")
        feeds = self._lacking("d", states, equal=True)
        ids, rows = [], []
        for i in range(n + int(extra_step)):
            rows.append(self._forward("d", states, feeds, 1)[:, 0])
            if i < n:
                ids.append(torch.as_tensor(pick(rows[-1], i)).long().reshape(len(states)))
                feeds = [[t] for t in ids[-1].tolist()]
        return (torch.stack(ids, 1) if ids else torch.zeros(len(states), 0, dtype=torch.long)), torch.stack(rows, 1)

    def _score(self, states: list[SequenceState], drafts: list[list[int]]) -> torch.Tensor:
        feeds = [lack + list(d) for lack, d in zip(self._lacking("v", states, equal=True), drafts)]
        return self._forward("v", states, feeds, len(drafts[0]) + 1)

    def _commit(self, states: list[SequenceState], tokens: Sequence[Sequence[int]]) -> None:
        for state, new in zip(states, tokens):
            before = len(state.tokens)
            state.tokens.extend(int(t) for t in new)
            for key, slot in state.extra["slots"].items():
                fed = state.extra[f"{key}_fed"]
                keep = min(common_prefix(fed, state.tokens, before), len(state.tokens) - 1)
                if keep < len(fed):
                    self.models[key].rollback(slot, keep)
                    del fed[keep:]

    # ---------------------------------------------------------------- one sequence

    def draft(self, state: SequenceState, n: int, pick: Pick, extra_step: bool = False) -> DraftResult:
        """Draft ``n`` tokens, one drafter decode each; ids and raw logits ``[n(+1), V]``."""
        ids, rows = self._draft([state], n, lambda z, i: torch.tensor([int(pick(z[0]))]), extra_step)
        return DraftResult([int(t) for t in ids[0]], rows[0])

    def score(self, state: SequenceState, draft_ids: Sequence[int]) -> torch.Tensor:
        """Verifier raw logits ``[N+1, V]`` (float32) in one decode."""
        return self._score([state], [[int(t) for t in draft_ids]])[0]

    def step(self, state: SequenceState) -> torch.Tensor:
        """Verifier raw logits ``[V]`` for the next token."""
        return self.score(state, [])[0]

    def commit(self, state: SequenceState, tokens: Sequence[int]) -> None:
        """Append ``tokens``; each context keeps the prefix it shares with the sequence
        (the last token left uncached)."""
        self._commit([state], [tokens])

    # ---------------------------------------------------------------- batches

    def start_batch(self) -> Batch:
        """An empty batch (rows hold their own slots)."""
        return Batch()

    def join(self, batch: Batch, prompts: Sequence[Sequence[int]]) -> list[SequenceState]:
        """Append one row per prompt; each context prefills all of it but the last
        token in one decode (``prefill_seconds``), a prompt given for several rows (the
        repeats of a problem) once, its cache copied to the others.

        Raises:
            ValueError: an empty prompt. RuntimeError: no free slot (nothing joins).
        """
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt must hold at least one token")
        states = []
        try:
            for p in prompts:
                states.append(self.start(p))
            for key, model in self.models.items():
                todo = [s for s in states if len(s.tokens) > 1]
                if not todo:
                    continue
                t0 = time.perf_counter()
                first: dict[tuple, SequenceState] = {}  # a prompt's first row; the others copy its cache
                for s in todo:
                    first.setdefault(tuple(s.tokens[:-1]), s)
                model.decode([(s.extra["slots"][key], 0, s.tokens[:-1], 0) for s in first.values()])
                for s in todo:
                    source = first[tuple(s.tokens[:-1])]
                    if source is not s:  # the same prompt (a repeat): prefilled once
                        model.copy(source.extra["slots"][key], s.extra["slots"][key])
                share = (time.perf_counter() - t0) / len(todo)
                for s in todo:
                    s.extra[f"{key}_fed"].extend(s.tokens[:-1])
                    s.prefill_seconds += share
                    if key == "v":
                        s.verify_tokens_fed += len(s.tokens) - 1
                    else:
                        s.draft_tokens_fed += len(s.tokens) - 1
        except BaseException:
            for s in states:
                s.extra["release"]()
            raise
        batch.states.extend(states)
        return states

    def leave(self, batch: Batch, rows: Sequence[int]) -> None:
        """Remove ``rows``; their slots are emptied and freed."""
        gone = set(rows)
        for i in gone:
            batch.states[i].extra["release"]()
        batch.states = [s for i, s in enumerate(batch.states) if i not in gone]

    def draft_batch(
        self, batch: Batch, n: int, pick: BatchPick, extra_step: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft ``n`` tokens for every row, one drafter decode per step. Returns ids
        ``[R, n]`` and raw logits ``[R, n(+1), V]`` (float32)."""
        return self._draft(batch.states, n, pick, extra_step)

    def score_batch(self, batch: Batch, draft_ids: torch.Tensor) -> torch.Tensor:
        """Verifier raw logits ``[R, N+1, V]`` over each row's lacking token and its
        drafts ``draft_ids [R, N]`` in one decode (N = 0: an AR step)."""
        return self._score(batch.states, draft_ids.tolist())

    def commit_batch(self, batch: Batch, tokens: Sequence[Sequence[int]]) -> None:
        """Append each row's tokens and roll each context back to what it shares."""
        self._commit(batch.states, tokens)

    # ---------------------------------------------------------------- costs, text

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
        """Forward costs on this machine at each serving batch size B, as every
        in-process backend measures them (``relaxtune.backends.costs.measure_profile``):
        B slots of each context hold the prompt plus 64 tokens (prefilled in one slot and
        copied to the others); a timed forward is one ``decode`` of all B slots, k tokens
        each, rolled back after it.

        While no sequence holds a slot, it measures in contexts of its own: the largest
        B sequences of the prompt + 64 + N + 1 cells each, freed afterwards (the
        contexts are made again, as they were sized, at their next use), so a job's
        generation contexts need not hold the profile's B slots (``fit_context``).

        Raises:
            ValueError: bad batch sizes, or a batch size above the contexts' sequence
                slots (llama.cpp's ``n_seq_max``, the backend's ``--batch-size``).
        """
        sizes = check_batch_sizes(batch_sizes)
        slots = self.slots
        if sizes[-1] > slots:
            raise ValueError(
                f"serving batch size {sizes[-1]} cannot be measured on llama.cpp here: its contexts hold "
                f"{slots} sequences (n_seq_max, from --batch-size {self.batch_size}); give --serving-batch-sizes "
                f"up to {slots}, or --batch-size {sizes[-1]}"
            )
        ctx = [int(t) for t in prompt_ids] + [int(t) % self.vocab_size for t in range(_PROFILE_TOKENS)]
        sized = self._profile_contexts(sizes[-1], len(ctx) + max(n_drafts, default=0) + 1)
        states = []
        try:
            for _ in range(sizes[-1]):
                states.append(self.start(ctx))
            models = {"verify": "v"} | ({"draft": "d"} if self.drafter is not None else {})
            for key in models.values():  # one slot prefilled, its cache copied to the others
                source = states[0].extra["slots"][key]
                self.models[key].decode([(source, 0, ctx, 1)])
                for s in states[1:]:
                    self.models[key].copy(source, s.extra["slots"][key])
            base = len(ctx)

            def job(name: str, k: int, b: int):
                key = models[name]
                model, rows = self.models[key], [s.extra["slots"][key] for s in states[:b]]
                feeds = [(slot, base, ctx[-k:], k) for slot in rows]

                def run() -> None:
                    model.decode(feeds)
                    for slot in rows:
                        model.rollback(slot, base)

                return run

            return measure_profile(
                job,
                n_drafts,
                sizes,
                "draft" in models,
                f"{self.name} on {platform.processor() or platform.machine()}, {self.verifier.threads} threads",
                min_passes,
                max_passes,
                clock=clock,
            )
        finally:
            for state in states:
                state.extra["release"]()
            if sized is not None:
                for model, (cells, n) in zip(self.models.values(), sized):
                    model.resize(cells, n)
                release_free_memory()  # the batch-16 logits' buffers

    def _profile_contexts(self, sequences: int, cells: int) -> list[tuple[int, int]] | None:
        """Size every context to ``sequences`` slots of ``cells`` cells for a cost
        profile; returns each context's ``(n_ctx_seq, slots)`` before, or None (nothing
        changed) while a sequence holds a slot."""
        if any(len(m.free) != m.slots for m in self.models.values()):
            return None
        before = [(m.n_ctx_seq, m.slots) for m in self.models.values()]
        for model in self.models.values():
            model.resize(cells, sequences)
        return before

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids to text (``skip_special_tokens``); ids as text without a tokenizer."""
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def close(self) -> None:
        """Free both contexts (the backend is unusable afterwards)."""
        for model in self.models.values():
            model.close()


def _release(models: dict[str, LlamaModel], slots: dict[str, int]) -> None:
    for key, slot in slots.items():
        models[key].release(slot)


# ------------------------------------------------------------------- loading


def resolve_gguf(model: str) -> Path:
    """The GGUF file of ``model``: an embedded name (its assembled GGUF, no
    conversion), else a path to a ``.gguf`` file.

    Raises:
        FileNotFoundError: no such file, or a folder / hub id (this backend reads
            GGUF files only), naming it.
    """
    from .embedded import EMBEDDED, assemble_gguf

    if model in EMBEDDED:
        return assemble_gguf(EMBEDDED[model])
    path = Path(os.path.expanduser(model)).resolve()
    if not path.is_file():
        raise FileNotFoundError(
            f"the llama.cpp backend loads GGUF files: no file {model!r} (give a .gguf path or an "
            f"embedded name: {', '.join(EMBEDDED)})"
        )
    return path


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, tokenizer: str | None):
    """A transformers tokenizer: ``tokenizer`` (id or folder) when given, else the
    GGUF's own, converted once (about 30 CPU seconds for Qwen's 151,936 tokens) and
    kept in the cache (``<cache>/tokenizers/<digest of path, size and mtime>``)."""
    from transformers import AutoTokenizer

    from .embedded import cache_dir

    if tokenizer:
        return AutoTokenizer.from_pretrained(tokenizer)
    gguf = Path(path)
    stat = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    kept = cache_dir() / "tokenizers" / digest
    if (kept / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(kept)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=kept.parent, prefix=f"{digest}-"))
    try:
        tok.save_pretrained(tmp)
        os.replace(tmp, kept)
    except OSError:  # another process kept it first
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def load_gguf_pair(
    drafter: str | None,
    verifier: str,
    batch_size: int | None = None,
    *,
    tokenizer=None,
    n_ctx_seq: int = 4096,
    threads: int | None = None,
) -> LlamaCppBackend:
    """Load a GGUF drafter/verifier pair into a ``LlamaCppBackend``.

    Args:
        drafter / verifier: embedded names or GGUF paths (drafter None: AR only).
        batch_size: sequences at once (default ``BATCH_SIZE_LLAMACPP``): the
            contexts' sequence slots.
        tokenizer: a transformers tokenizer, or a tokenizer id/folder; default:
            read from the verifier's GGUF (needs the ``gguf`` package).
        n_ctx_seq: KV cells per sequence (prompt + response + N + 1).
        threads: CPU threads (default: torch's).

    Raises:
        FileNotFoundError / ValueError: a model that cannot be loaded, by name;
            ValueError also for two vocabularies that differ.
        relaxtune.backends.llamacpp_model.LlamaCppMissing: llama-cpp-python is not installed.
    """
    size = int(batch_size or BATCH_SIZE_LLAMACPP)
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    v_path = resolve_gguf(verifier)
    d_path = resolve_gguf(drafter) if drafter is not None else None
    # the tokenizer (transformers: Python, about 2.5 CPU s with its import) loads on a thread of its own
    # while llama.cpp loads the models (C, the GIL released): the load takes the longer of the two, not both
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as pool:
        tok = tokenizer
        pending = pool.submit(_tokenizer, str(v_path), tok) if tok is None or isinstance(tok, str) else None
        try:
            # a verifier decode holds B x (N + 1) tokens (N up to 21 in one call); the drafter's hold B or 2B
            v_model = LlamaModel(v_path, size, n_ctx_seq, threads, max(512, 22 * size))
            d_model = LlamaModel(d_path, size, n_ctx_seq, threads, 512) if d_path is not None else None
        except BaseException:
            if pending is not None:
                pending.cancel()
            raise
        if pending is not None:
            try:
                tok = pending.result()
            except Exception as err:
                raise ValueError(
                    f"cannot read a tokenizer from {tokenizer or v_path} ({err}); give --tokenizer"
                ) from err
    release_free_memory()  # what the tokenizer's thread freed (its parse buffers) stays resident otherwise
    return LlamaCppBackend(d_model, v_model, tok, name=gguf_pair_name(drafter, verifier), batch_size=size)
