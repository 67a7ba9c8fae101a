"""One GGUF model in one llama.cpp context: sequence slots, batched decodes, rollback.

The low-level API of llama-cpp-python (``pip install 'relaxtune[llamacpp]'``): a
context holds ``slots`` sequences, each with a KV stream of its own of ``n_ctx_seq``
cells (``kv_unified = False``: a sequence attends only to its own stream). One
``decode`` call feeds any number of sequences at once and returns, per sequence,
the full-vocabulary logits of its last ``keep`` positions; ``rollback`` removes a
sequence's cached positions from some point on (``llama_memory_seq_rm``).

llama.cpp splits such a batch into micro-batches in which every sequence has the
same number of tokens and the sequence ids run consecutively
(``llama_batch_allocr::split_equal`` with ``sequential``): ``decode`` orders the
feeds by slot, and slots are handed out lowest first, so a batch whose rows all
feed the same number of tokens runs as one forward.

Memory (the embedded pair, 2026-12-03, llama-cpp-python 0.3.36): the weights are
read with direct I/O (``LLAMA_LOAD_MODE_DIRECT_IO``) into the process, not
mapped: mapped, the file's pages stay resident beside the copies llama.cpp
repacks for this CPU (0.6 GB of the verifier's 1.1 GB held twice), and a read
through the page cache is charged to the process tree's cgroup again. The KV
cache (f16, ``slots x n_ctx_seq`` cells, all written at creation) is the other
large part: the context is made at its first use, so ``resize`` can fit
``n_ctx_seq`` to a job's longest sequence, and ``slots`` to the sequences it runs
at once, before any memory is spent on it (``LlamaCppBackend.fit_context``; the cost
profile's batch of 16 gets contexts of its own, freed after it).
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .llamacpp_check import extra_buffers_run

__all__ = ["LlamaModel", "LlamaCppMissing", "require_llama_cpp", "release_free_memory", "MAX_SEQUENCES"]

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: the most sequences a context holds (n_seq_max)
CTX_PAD = 1  # llama.cpp pads a context's cells per sequence to a multiple of this
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """``message`` as a warning, once per process."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class LlamaCppMissing(RuntimeError):
    """llama-cpp-python is not installed (the message says how to install it)."""


def require_llama_cpp():
    """The ``llama_cpp`` module, quiet below errors.

    Raises:
        LlamaCppMissing: it is not importable.
    """
    try:
        import llama_cpp
    except (ImportError, OSError) as err:
        raise LlamaCppMissing(
            f"the llama.cpp backend needs llama-cpp-python ({err}); install it with "
            "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install 'relaxtune[llamacpp]' (builds from source: ~5 min on 2 cores)"
        ) from None
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    if not getattr(require_llama_cpp, "_init", False):
        global _log_callback
        _log_callback = llama_cpp.llama_log_callback(_errors_only)  # kept: llama.cpp holds the pointer
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        require_llama_cpp._init = True
    return llama_cpp


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim(0)``); True
    where it ran (glibc), False elsewhere.

    glibc keeps what a thread freed in that thread's arena: the tokenizer, read on a
    thread of its own while the models load, leaves about 90 MB of freed parse buffers
    resident (transformers 5.24, Qwen's 151,936 tokens, 2026-12-03), and a cost
    profile's batch-16 logits about as much, until the process ends.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


GGML_LOG_ERROR, GGML_LOG_CONT = 4, 5  # enum ggml_log_level (ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_log_callback = None
_last_level = [0]


def _errors_only(level: int, text: bytes, user_data) -> None:
    """llama.cpp's log callback: errors (and their continuation lines) to stderr, the rest
    dropped. llama-cpp-python's own callback reads the levels of an older ggml enum (today's
    WARN as its ERROR), so load-time warnings such as "control-looking token" were printed
    among the job's progress lines."""
    level = _last_level[0] if level == GGML_LOG_CONT else level
    _last_level[0] = level
    if level == GGML_LOG_ERROR:
        sys.stderr.write(text.decode("utf-8", "replace"))
        sys.stderr.flush()


class LlamaModel:
    """A GGUF model with a context of ``slots`` sequences.

    Args:
        path: the GGUF file.
        slots: sequences the context holds at once (``n_seq_max``).
        n_ctx_seq: KV cells per sequence (prompt + response + N + 1 must fit).
        threads: CPU threads (default: torch's thread count).
        n_batch: most tokens one llama.cpp decode takes (longer feeds are split).

    The weights load here; the context (the KV cache) is made at its first use
    (``acquire``, ``decode``, ``rollback``), ``n_ctx_seq`` then rounded up to a
    multiple of ``CTX_PAD`` (as llama.cpp pads it).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: llama.cpp cannot load it (not a GGUF, an unknown architecture),
            naming the file; at first use, it cannot make the context.
        LlamaCppMissing: llama-cpp-python is not installed.
    """

    def __init__(
        self, path: str | Path, slots: int = 1, n_ctx_seq: int = 4096, threads: int | None = None, n_batch: int = 512
    ) -> None:
        self.L = L = require_llama_cpp()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no GGUF file {self.path}")
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        if "load_mode" in dict(type(mp)._fields_):  # read into memory once: see the module doc
            mp.load_mode = L.LLAMA_LOAD_MODE_DIRECT_IO
        if "use_extra_bufts" in dict(type(mp)._fields_):  # repacked / AMX weights, where this CPU runs them
            runs, why = extra_buffers_run(self.path)
            if not runs:
                mp.use_extra_bufts = False
                _warn_once(
                    f"llama.cpp's extra buffer types (repacked weights, Intel AMX tiles) crashed on this CPU "
                    f"({self.path}: {why}), so it loads without them, slower: the CPU advertises kernels its "
                    "machine does not run (AMX in a VM), or the wheel was built for another CPU. --runtime hf "
                    "avoids llama.cpp"
                )
        self.model = L.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self.model:
            raise ValueError(
                f"llama.cpp cannot load {self.path} (not a GGUF model, or an architecture this "
                "llama-cpp-python build does not know)"
            )
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.n_batch, self.slots = int(n_batch), int(slots)
        self.threads = int(threads or torch.get_num_threads())
        self.n_ctx_seq = int(n_ctx_seq)
        self.ctx = self.mem = self.batch = None  # made at its first use (_context)
        self.free = list(range(self.slots))
        self.lock = threading.Lock()

    # ------------------------------------------------------------ context

    def _context(self) -> None:
        """Make the context (``slots`` sequences of ``n_ctx_seq`` cells) unless it exists.

        Raises:
            ValueError: llama.cpp cannot make it (too little memory?).
        """
        if self.ctx is not None:
            return
        L = self.L
        cp = L.llama_context_default_params()
        cells = -(-self.n_ctx_seq // CTX_PAD) * CTX_PAD  # as llama.cpp pads it, without its warning
        cp.n_seq_max, cp.n_ctx = self.slots, self.slots * cells
        cp.n_batch = cp.n_ubatch = self.n_batch
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.kv_unified, cp.no_perf = False, True
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise ValueError(
                f"llama.cpp cannot make a context for {self.path} ({self.slots} sequences of {self.n_ctx_seq} "
                "tokens: too little memory?)"
            )
        self.ctx, self.mem = ctx, L.llama_get_memory(ctx)
        self.n_ctx_seq = int(L.llama_n_ctx_seq(ctx))
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)

    def resize(self, n_ctx_seq: int, slots: int | None = None) -> None:
        """Hold ``n_ctx_seq`` KV cells per sequence (and ``slots`` sequences, when
        given) from now on: a context made already is freed, and made again (empty)
        at the next use, so its KV cache is ``slots x n_ctx_seq`` cells.

        Raises:
            ValueError: ``n_ctx_seq`` < 1, or ``slots`` outside [1, 256] (llama.cpp's
                ``LLAMA_MAX_SEQ``).
            RuntimeError: a sequence holds a slot (its cache would be lost).
        """
        if n_ctx_seq < 1:
            raise ValueError(f"n_ctx_seq must be >= 1, got {n_ctx_seq}")
        if slots is not None and not 1 <= slots <= MAX_SEQUENCES:
            raise ValueError(f"slots must lie in [1, {MAX_SEQUENCES}], got {slots}")
        with self.lock:
            if len(self.free) != self.slots:
                raise RuntimeError(f"{self.path.name}: cannot resize the context while sequences hold slots")
            self._free_context()
            self.n_ctx_seq = int(n_ctx_seq)
            if slots is not None:
                self.slots = int(slots)
                self.free = list(range(self.slots))

    def _free_context(self) -> None:
        if self.ctx is not None:
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.ctx = self.mem = self.batch = None

    # ------------------------------------------------------------ slots

    def acquire(self) -> int:
        """The lowest free sequence slot.

        Raises:
            RuntimeError: every slot is taken.
        """
        with self.lock:
            self._context()
            if not self.free:
                raise RuntimeError(
                    f"{self.path.name}: all {self.slots} sequence slots are in use (a larger batch_size gives more)"
                )
            self.free.sort()
            return self.free.pop(0)

    def release(self, slot: int) -> None:
        """Empty ``slot`` and return it to the free slots."""
        with self.lock:
            if self.ctx is not None:
                self.L.llama_memory_seq_rm(self.mem, slot, -1, -1)
            if slot not in self.free:
                self.free.append(slot)

    def copy(self, source: int, slot: int) -> None:
        """Make ``slot``'s cache a copy of ``source``'s, every position
        (``llama_memory_seq_cp``): as if ``slot`` had been fed what ``source`` was,
        without running the model again (a prompt prefilled once for several rows)."""
        with self.lock:
            self._context()
            self.L.llama_memory_seq_rm(self.mem, slot, -1, -1)
            self.L.llama_memory_seq_cp(self.mem, source, slot, -1, -1)

    def rollback(self, slot: int, keep: int) -> None:
        """Keep only positions ``[0, keep)`` of ``slot``."""
        with self.lock:
            self._context()
            if not self.L.llama_memory_seq_rm(self.mem, slot, int(keep), -1):
                raise RuntimeError(f"{self.path.name}: llama.cpp could not roll sequence {slot} back to {keep}")

    # ------------------------------------------------------------ decode

    def decode(self, feeds: Sequence[tuple[int, int, Sequence[int], int]]) -> torch.Tensor:
        """Feed every sequence its tokens and return the logits of their last positions.

        Args:
            feeds: per sequence ``(slot, first position, token ids, keep)``: the ids
                go to positions ``first ..``; ``keep`` (<= len(ids)) of the last
                positions return logits. At most one feed per slot.

        Returns:
            float32 ``[sum of keep, V]``: the feeds' rows in the order given.

        Raises:
            ValueError: a token id outside the vocabulary, an empty feed, a slot fed
                twice, or a sequence longer than its ``n_ctx_seq`` cells.
            RuntimeError: llama.cpp fails to decode (its return code).
        """
        with self.lock:
            self._context()  # its n_ctx_seq, as llama.cpp padded it
        if len({f[0] for f in feeds}) != len(feeds):
            raise ValueError("one feed per sequence slot")
        for slot, pos, ids, keep in feeds:
            if not ids or not 0 <= keep <= len(ids):
                raise ValueError(f"a feed needs tokens and 0 <= keep <= their count (got {len(ids)}, keep {keep})")
            if pos + len(ids) > self.n_ctx_seq:
                raise ValueError(
                    f"{self.path.name}: a sequence of {pos + len(ids)} tokens exceeds the "
                    f"{self.n_ctx_seq} cells per sequence (raise n_ctx_seq)"
                )
            if min(ids) < 0 or max(ids) >= self.n_vocab:
                raise ValueError(f"token ids must lie in [0, {self.n_vocab})")
        # pieces of at most n_batch tokens, in slot order; a call never holds two pieces of one slot
        order = sorted(range(len(feeds)), key=lambda i: feeds[i][0])
        pending = []
        for i in order:
            slot, pos, ids, keep = feeds[i]
            for s in range(0, len(ids), self.n_batch):
                part = list(ids[s : s + self.n_batch])
                out_from = len(ids) - keep  # positions >= out_from return logits
                pending.append((i, slot, pos + s, part, max(0, s + len(part) - max(out_from, s))))
        rows: dict[int, list[np.ndarray]] = {i: [] for i in range(len(feeds))}
        with self.lock:
            while pending:
                call, used, seen, rest = [], 0, set(), []
                for piece in pending:
                    if piece[1] in seen or used + len(piece[3]) > self.n_batch:
                        rest.append(piece)
                    else:
                        call.append(piece)
                        seen.add(piece[1])
                        used += len(piece[3])
                pending = rest
                self._run(call, rows)
        out = [r for i in range(len(feeds)) for r in rows[i]]
        if not out:
            return torch.zeros(0, self.n_vocab)
        return torch.from_numpy(np.concatenate(out) if len(out) > 1 else out[0])

    def _run(self, pieces, rows: dict[int, list[np.ndarray]]) -> None:
        """One ``llama_decode`` of ``pieces`` (in order); appends each piece's logit rows."""
        L, b, k = self.L, self.batch, 0
        for _, slot, pos, part, keep in pieces:
            first_out = len(part) - keep
            for j, tok in enumerate(part):
                b.token[k] = tok
                b.pos[k] = pos + j
                b.n_seq_id[k] = 1
                b.seq_id[k][0] = slot
                b.logits[k] = j >= first_out
                k += 1
        b.n_tokens = k
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"{self.path.name}: llama_decode returned {rc} (1: no KV cells left, <0: an error)")
        n_out = sum(p[4] for p in pieces)
        if n_out == 0:
            return
        ptr = L.llama_get_logits(self.ctx)
        block = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_out, self.n_vocab))
        at = 0
        for i, *_, keep in pieces:
            if keep:
                rows[i].append(block[at : at + keep].copy())
                at += keep

    # ------------------------------------------------------------ vocabulary

    def token_texts(self) -> list[bytes]:
        """Every token's text as stored in the GGUF (to compare two vocabularies)."""
        return [self.L.llama_vocab_get_text(self.vocab, i) or b"" for i in range(self.n_vocab)]

    def end_ids(self) -> frozenset[int]:
        """The ids llama.cpp treats as ends of generation (``llama_vocab_is_eog``)."""
        return frozenset(i for i in range(self.n_vocab) if self.L.llama_vocab_is_eog(self.vocab, i))

    def close(self) -> None:
        """Free the context and the model (idempotent)."""
        with self.lock:
            self._free_context()
            if self.model is not None:
                self.L.llama_model_free(self.model)
                self.model = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass
