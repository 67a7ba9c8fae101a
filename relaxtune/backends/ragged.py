"""Key/value caches of sequences of different lengths in one batch, for one model.

Every layer holds one tensor ``[R, H, S, D]`` for the R sequences (rows) in the
batch; each row uses only some of the S columns. ``valid [R, S]`` marks them:

- a row that joins is prefilled alone (its own cache, all its prompt but the
  last token; a ``PrefillStore`` keeps prefills for the next evaluation of the
  same prompt) and then left-padded to the batch's width (or the batch to its);
- a forward feeds each row the tokens its cache lacks, left-padded to the
  longest feed; pads are invalid columns;
- a rollback (rejected drafts) marks the row's last columns invalid: no copy,
  the row simply stops attending to them; columns no row uses are cropped;
- when holes make the batch more than twice as wide as its longest row,
  ``compact`` moves every row's valid columns to the right end (one gather
  per layer).

Each row's positions (RoPE) count only its valid columns, and the attention
mask (built here, 4-D, additive) lets a query see its row's valid columns up to
itself, so a row's logits equal a forward over that sequence alone up to float
rounding. Pads see their row's history (never an empty set, so never NaN).
Only full-attention layers are supported (``supports``).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

__all__ = ["RaggedCache", "PrefillStore", "supports"]

COMPACT_WASTE = 0.5  # compact when compacting would remove more than this share of the columns
PAD_ID = 0  # the token id fed at pad positions (its output is never read)


class PrefillStore:
    """Prompt prefills of one model, kept for reuse: a prompt evaluated again
    (the next trial of a study, another repeat) joins a batch without a forward.
    Least recently used first out, within ``max_bytes``; the kept tensors are
    only ever copied from, never written.

    Args:
        max_bytes: the most bytes of keys and values kept (default 1 GiB).
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes, self.bytes = int(max_bytes), 0
        self.items: OrderedDict[tuple[int, ...], tuple[list, int]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The layers' ``(keys, values)`` of ``ids``, or None."""
        found = self.items.get(tuple(ids))
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self.items.move_to_end(tuple(ids))
        return found[0]

    def put(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep ``layers`` for ``ids``, dropping the least recently used over the budget."""
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if size > self.max_bytes:
            return
        self.items[tuple(ids)] = (layers, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self.items.popitem(last=False)
            self.bytes -= dropped


def supports(model) -> bool:
    """True when every attention layer of ``model`` attends over the whole
    sequence (no sliding window): the ragged cache's 4-D mask assumes it."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = DynamicCache(config=model.config).layers
    return all(type(layer) is DynamicLayer for layer in layers)


class RaggedCache:
    """The batched KV cache of one model (drafter or verifier).

    Attributes:
        fed: per row, the token ids its valid columns hold, in order.
        cols: per row, the column index of each of them.
        valid: ``[R, S]`` bool, the columns each row attends to.

    Args:
        model: a transformers causal LM with full attention.
        device: where the model runs.
        store: prompt prefills of this model kept for reuse (optional).
    """

    def __init__(self, model, device: torch.device | str, store: PrefillStore | None = None) -> None:
        from transformers import DynamicCache

        self.model, self.device, self.store = model, torch.device(device), store
        self.cache = DynamicCache(config=model.config)
        self.valid = torch.zeros(0, 0, dtype=torch.bool)
        self.fed: list[list[int]] = []
        self.cols: list[list[int]] = []

    @property
    def rows(self) -> int:
        """R, the sequences in the batch."""
        return len(self.fed)

    @property
    def width(self) -> int:
        """S, the columns of every layer's tensors."""
        return self.valid.shape[1]

    def _layers(self):
        return [layer for layer in self.cache.layers if layer.is_initialized and layer.keys.dim() == 4]

    def _regather(self, index: torch.Tensor) -> None:
        """Every layer's ``[R, H, S, D]`` tensors to ``[R', H, S', D]`` with
        ``index [R', S']`` naming, per new row, the old flat column ``r * S + s``
        (-1: a zero pad)."""
        for layer in self._layers():
            for name in ("keys", "values"):
                t = getattr(layer, name)
                r, h, s, d = t.shape
                flat = torch.cat([t.transpose(1, 2).reshape(r * s, h, d), t.new_zeros(1, h, d)])
                idx = torch.where(index < 0, r * s, index).to(t.device)
                setattr(layer, name, flat[idx.reshape(-1)].reshape(*index.shape, h, d).transpose(1, 2).contiguous())

    # ------------------------------------------------------------ rows

    def _prefill(self, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Per layer, the keys and values ``[1, H, len(ids), D]`` of ``ids`` (from the
        store, else one forward of their own); None for no tokens."""
        from transformers import DynamicCache

        if not ids:
            return None
        if self.store is not None and (kept := self.store.get(ids)) is not None:
            return kept
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            self.model(input_ids=torch.tensor([ids], device=self.device), cache=cache, use_cache=True, logits_to_keep=1)
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        if self.store is not None:
            self.store.put(ids, layers)
        return layers

    def join(self, prefix_ids: list[list[int]]) -> list[float]:
        """Add one row per sequence, prefilled with ``prefix_ids[i]`` (may be empty;
        from the ``PrefillStore`` when it holds them, else in a forward of its
        own), then right-aligned with the batch (the narrower side is left-padded
        with invalid zero columns).

        Returns:
            the seconds each row's prefill took.
        """
        seconds, prefills = [], []
        for ids in prefix_ids:
            t0 = time.perf_counter()
            prefills.append(self._prefill(list(ids)))
            seconds.append(time.perf_counter() - t0)
        old_r, old_s = self.rows, self.width
        width = max([old_s] + [len(ids) for ids in prefix_ids])
        for i, layer in enumerate(self.cache.layers):
            sources = [(slice(0, old_r), (layer.keys, layer.values))] if layer.is_initialized else []
            sources += [(old_r + k, p[i]) for k, p in enumerate(prefills) if p is not None]
            if not sources:
                continue  # nothing cached in this layer yet: the first forward initialises it
            like = sources[-1][1][0]
            if not layer.is_initialized:
                layer.lazy_initialization(like, like)
            for j, name in enumerate(("keys", "values")):
                out = like.new_zeros(old_r + len(prefills), like.shape[1], width, like.shape[3])
                for at, kv in sources:
                    out[at, :, width - kv[j].shape[2] :] = kv[j][0] if isinstance(at, int) else kv[j]
                setattr(layer, name, out)
        shift = width - old_s
        valid = torch.zeros(old_r + len(prefix_ids), width, dtype=torch.bool)
        valid[:old_r, shift:] = self.valid
        self.cols = [[c + shift for c in cols] for cols in self.cols]
        for k, ids in enumerate(prefix_ids):
            valid[old_r + k, width - len(ids) :] = True
            self.cols.append(list(range(width - len(ids), width)))
            self.fed.append(list(ids))
        self.valid = valid
        return seconds

    def leave(self, rows: list[int]) -> None:
        """Remove ``rows`` (indices into the batch) and crop columns nobody uses."""
        gone = set(rows)
        keep = [r for r in range(self.rows) if r not in gone]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for layer in self._layers():
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.fed = [self.fed[r] for r in keep]
        self.cols = [self.cols[r] for r in keep]
        self.valid = self.valid[keep]
        self._crop_left()
        self._crop_right()

    # ------------------------------------------------------------ forward

    def forward(self, feeds: list[list[int]], keep: int) -> torch.Tensor:
        """One forward pass of every row over the tokens it lacks (``feeds[r]``,
        at least one each), left-padded to the longest.

        Returns:
            float32 logits ``[R, keep, V]`` on the CPU: the last ``keep`` positions
            of each row (``keep`` must not exceed the shortest feed).

        Raises:
            ValueError: a feed count other than R, an empty feed, or ``keep`` longer
                than a feed.
        """
        if len(feeds) != self.rows or not all(feeds) or keep > min(map(len, feeds)):
            raise ValueError(f"need one non-empty feed per row ({self.rows}) of at least keep = {keep} tokens")
        r, q, s = self.rows, max(map(len, feeds)), self.width
        ids = torch.full((r, q), PAD_ID, dtype=torch.long)
        new = torch.zeros(r, q, dtype=torch.bool)
        pos = torch.zeros(r, q, dtype=torch.long)
        for b, feed in enumerate(feeds):
            n = len(feed)
            ids[b, q - n :] = torch.tensor(feed)
            new[b, q - n :] = True
            pos[b] = len(self.fed[b]) + (torch.arange(q) - (q - n)).clamp_min(0)
        causal = torch.ones(q, q, dtype=torch.bool).tril()
        allowed = torch.cat([self.valid[:, None, :].expand(r, q, s), causal[None] & new[:, None, :]], -1)
        dtype = self.model.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        with torch.inference_mode():
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask[:, None].to(self.device),
                position_ids=pos.to(self.device),
                cache=self.cache,
                use_cache=True,
                logits_to_keep=keep,
            )
        for b, feed in enumerate(feeds):
            self.cols[b].extend(range(s + q - len(feed), s + q))
            self.fed[b].extend(feed)
        self.valid = torch.cat([self.valid, new], 1)
        return out.logits[:, -keep:].float().cpu()

    # ------------------------------------------------------------ rollback

    def rollback(self, row: int, keep: int) -> None:
        """Keep only the first ``keep`` fed tokens of ``row`` (the rest become holes)."""
        for c in self.cols[row][keep:]:
            self.valid[row, c] = False
        del self.cols[row][keep:]
        del self.fed[row][keep:]

    def tidy(self) -> None:
        """Crop columns no row uses at either end; compact when that would remove
        more than ``COMPACT_WASTE`` of the columns (attention reads them all)."""
        self._crop_right()
        self._crop_left()
        if self.width - max(map(len, self.cols), default=0) > COMPACT_WASTE * self.width:
            self.compact()

    def _crop_right(self) -> None:
        used = self.valid.any(0).nonzero()
        end = int(used[-1]) + 1 if used.numel() else 0
        if end < self.width:
            for layer in self._layers():
                layer.keys, layer.values = layer.keys[..., :end, :], layer.values[..., :end, :]
            self.valid = self.valid[:, :end]

    def _crop_left(self) -> None:
        used = self.valid.any(0).nonzero()
        start = int(used[0]) if used.numel() else self.width
        if start > 0:
            for layer in self._layers():
                layer.keys, layer.values = layer.keys[..., start:, :], layer.values[..., start:, :]
            self.valid = self.valid[:, start:]
            self.cols = [[c - start for c in cols] for cols in self.cols]

    def compact(self) -> None:
        """Move every row's valid columns to the right end, in order (no holes left)."""
        width = max(map(len, self.cols), default=0)
        index = torch.full((self.rows, width), -1, dtype=torch.long)
        for b, cols in enumerate(self.cols):
            if cols:
                index[b, width - len(cols) :] = b * self.width + torch.tensor(cols)
        self._regather(index)
        self.cols = [list(range(width - len(cols), width)) for cols in self.cols]
        self.valid = index >= 0
