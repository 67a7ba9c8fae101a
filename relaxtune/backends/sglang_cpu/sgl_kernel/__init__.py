"""A pure-torch stand-in for SGLang's ``sgl_kernel`` package on a CPU without Intel AMX.

SGLang 0.5.23 imports ``sgl_kernel`` on CPU unconditionally, but PyPI has no CPU build of
it (the CUDA ``sglang-kernel`` fails to import without ``libcuda.so.1``). On a CPU without
AMX, SGLang gates every CPU kernel call on ``cpu_has_amx_support()`` (the op
``convert_weight_packed``, which this module does NOT define, must exist for that) and runs
each layer's ``forward_native`` torch code instead; only the names below are used whatever
that check says (``docs/reference/sglang-cpu.md``, read from SGLang 0.5.23's source):

- ``assign_req_to_token_pool_cpu`` (``srt/mem_cache/allocation.py``, every extend);
- ``copy_all_layer_kv_cache_cpu`` (``kernels/ops/kvcache/cache_move.py``, KV moves);
- the op ``torch.ops.sgl_kernel.murmur_hash32_cpu`` (``kernels/ops/sampling/murmur_hash.py``,
  seeded sampling);
- names imported at module level by ``kernels/ops/speculative/*.py``: they must exist,
  but only speculative decoding calls them, and it cannot run on such a CPU (its
  ``torch_native`` attention backend refuses EAGLE), so they raise ``NotImplementedError``.

This folder's parent goes on the SGLang server's ``PYTHONPATH`` (``relaxtune serve`` does it
on a CPU host, unless the CPU has AMX and SGLang's environment has a compiled CPU build of the
kernels: without ``convert_weight_packed`` SGLang takes the same torch paths on an AMX CPU).
It imports torch only: it runs inside SGLang's own environment.
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+relaxtune.cpu.standin"

__all__ = ["assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu", "murmur_hash32", "murmur_hash32_cpu"]

_MASK = 0xFFFFFFFF


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV locations into its row of the request-to-token table, in place.

    For request ``r`` in order, ``req_to_token[req_pool_indices[r], start_offset[r]:end_offset[r]]``
    gets the next ``end_offset[r] - start_offset[r]`` entries of ``out_cache_loc`` (the
    requests' new locations, concatenated in request order). As SGLang's Triton kernel
    ``assign_req_to_token_pool`` (``srt/mem_cache/allocation.py``).

    Args:
        req_pool_indices: ``[B]`` integer rows of ``req_to_token``.
        req_to_token: ``[R, pool_len]`` integer table (written in place).
        start_offset, end_offset: ``[B]`` integer column ranges.
        out_cache_loc: ``[sum(end - start)]`` integer locations.
        pool_len: ``req_to_token.shape[1]``.

    Raises:
        ValueError: ``out_cache_loc`` is shorter than the ranges ask, or ``pool_len`` is not the table's width.
    """
    if req_to_token.shape[1] != pool_len:
        raise ValueError(f"pool_len {pool_len} is not req_to_token's width {req_to_token.shape[1]}")
    rows, starts, ends = req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()
    need = sum(e - s for s, e in zip(starts, ends))
    if need > out_cache_loc.numel():
        raise ValueError(f"the ranges ask for {need} locations, out_cache_loc holds {out_cache_loc.numel()}")
    at = 0
    for row, s, e in zip(rows, starts, ends):
        req_to_token[row, s:e] = out_cache_loc[at : at + e - s].to(req_to_token.dtype)
        at += e - s


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """Copy KV rows ``src_loc[j] -> tgt_loc[j]`` inside every KV buffer, in place.

    Buffer ``i`` starts at address ``data_ptrs[i]`` and its rows are ``strides[i]`` bytes.
    Every source row is read before any target is written (safe when the two sets overlap),
    as SGLang's Triton kernel ``copy_all_layer_kv_cache_tiled`` (``kernels/ops/kvcache/cache_move.py``).

    Args:
        data_ptrs: ``[L]`` int64 base addresses of live CPU tensors.
        strides: ``[L]`` row sizes in bytes.
        tgt_loc, src_loc: ``[M]`` row indices.

    Raises:
        ValueError: ``tgt_loc`` and ``src_loc`` differ in length.
    """
    if tgt_loc.numel() != src_loc.numel():
        raise ValueError(f"tgt_loc has {tgt_loc.numel()} rows, src_loc {src_loc.numel()}")
    src, tgt = src_loc.tolist(), tgt_loc.tolist()
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + s * stride, stride) for s in src]
        for t, row in zip(tgt, rows):
            ctypes.memmove(base + t * stride, row, stride)


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """``(a * c) mod 2**32`` for int64 ``a`` in [0, 2**32) without int64 overflow."""
    lo = a * (c & 0xFFFF)
    hi = ((a * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _MASK


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 x86_32's block step (Appleby, SMHasher ``MurmurHash3_x86_32``)."""
    k = _rotl32(_mul32(k, 0xCC9E2D51), 15)
    k = _mul32(k, 0x1B873593)
    h = _rotl32(h ^ k, 13)
    return (_mul32(h, 5) + 0xE6546B64) & _MASK


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's final avalanche ``fmix32``."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def murmur_hash32(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 x86_32 of the four 32-bit blocks (seed low, seed high, position, column), hash seed 0.

    Equal to ``MurmurHash3_x86_32(pack('<IIII', seed & 0xFFFFFFFF, seed >> 32, pos, col), 0)``
    for every pair (row, column); SGLang's ``murmur_hash32_kernel``
    (``kernels/ops/sampling/murmur_hash.py``) computes the same on GPU.

    Args:
        seed: ``[n]`` integer seeds (64-bit; their two's-complement bits are hashed).
        positions: ``[n]`` integer positions (low 32 bits hashed).
        col_indices: ``[m]`` integer columns (low 32 bits hashed).

    Returns:
        ``[n, m]`` torch.uint32 hashes.

    Raises:
        ValueError: not 1-D, or ``seed`` and ``positions`` differ in shape.
    """
    if seed.dim() != 1 or col_indices.dim() != 1 or seed.shape != positions.shape:
        raise ValueError(
            f"seed and positions must be [n] and col_indices [m]; got {tuple(seed.shape)}, "
            f"{tuple(positions.shape)}, {tuple(col_indices.shape)}"
        )
    s = seed.to(torch.int64)
    lo = (s & _MASK)[:, None]
    hi = ((s >> 32) & _MASK)[:, None]
    pos = (positions.to(torch.int64) & _MASK)[:, None]
    col = (col_indices.to(torch.int64) & _MASK)[None, :]
    h = torch.zeros(seed.shape[0], 1, dtype=torch.int64)
    for k in (lo, hi, pos):
        h = _mix(h, k)
    h = _mix(h.expand(-1, col.shape[1]), col.expand(h.shape[0], -1))
    return _fmix32(h ^ 16).to(torch.uint32)


@torch.library.custom_op("sgl_kernel::murmur_hash32_cpu", mutates_args=())
def murmur_hash32_cpu(seed: torch.Tensor, positions: torch.Tensor, col_indices: torch.Tensor) -> torch.Tensor:
    """``torch.ops.sgl_kernel.murmur_hash32_cpu``: ``murmur_hash32`` as a torch op (``[n, m]`` uint32)."""
    return murmur_hash32(seed, positions, col_indices)


@murmur_hash32_cpu.register_fake
def _murmur_fake(seed, positions, col_indices):
    return seed.new_empty((seed.shape[0], col_indices.shape[0]), dtype=torch.uint32)


def _speculative_only(name: str):
    def unavailable(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: speculative decoding does not run on a CPU without AMX "
            "(this is relaxtune's pure-torch stand-in for sgl_kernel)"
        )

    unavailable.__name__ = name
    return unavailable


# imported at module level by sglang/kernels/ops/speculative/*.py on CPU; only speculative decoding calls them
_SPECULATIVE = (
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
)
for _name in _SPECULATIVE:
    globals()[_name] = _speculative_only(_name)
__all__ += list(_SPECULATIVE)
