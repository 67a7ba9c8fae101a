"""The pure-torch ``sgl_kernel`` stand-in (``relaxtune/backends/sglang_cpu/sgl_kernel``), checked
against reference implementations: MurmurHash3 x86_32 as in Appleby's SMHasher (its published
test vectors), the request-to-token table and KV row copies against plain indexing."""

from __future__ import annotations

import struct
import sys

import pytest
import torch

from relaxtune.backends.sglang_cpu import KERNEL_DIR

sys.path.insert(0, str(KERNEL_DIR))
import sgl_kernel

sys.path.remove(str(KERNEL_DIR))


def murmur3_x86_32(data: bytes, seed: int = 0) -> int:
    """Reference MurmurHash3_x86_32 (SMHasher ``MurmurHash3.cpp``), in plain Python."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    rotl = lambda x, r: ((x << r) | (x >> (32 - r))) & mask  # noqa: E731
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = rotl(k * c1 & mask, 15) * c2 & mask
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & mask
    tail = data[n:]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= rotl(k * c1 & mask, 15) * c2 & mask
    h ^= len(data)
    h ^= h >> 16
    h = h * 0x85EBCA6B & mask
    h ^= h >> 13
    h = h * 0xC2B2AE35 & mask
    return h ^ (h >> 16)


@pytest.mark.parametrize(
    "data, seed, expected",
    [
        (b"", 0, 0x00000000),
        (b"", 1, 0x514E28B7),
        (b"", 0xFFFFFFFF, 0x81F16F39),
        (b"\xff\xff\xff\xff", 0, 0x76293B50),
        (b"\x21\x43\x65\x87", 0, 0xF55B516B),
        (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
        (b"\x21\x43\x65", 0, 0x7E4A8634),
        (b"\x21\x43", 0, 0xA0F7B07A),
        (b"\x21", 0, 0x72661CF4),
        (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
        (b"aaaa", 0x9747B28C, 0x5A97808A),
        (b"Hello, world!", 0x9747B28C, 0x24884CBA),
        (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
    ],
)
def test_reference_murmur3_matches_published_vectors(data, seed, expected):
    assert murmur3_x86_32(data, seed) == expected


def test_murmur_op_equals_murmur3_of_the_four_blocks():
    g = torch.Generator().manual_seed(0)
    seeds = torch.cat(
        [
            torch.tensor([0, 1, -1, 2**63 - 1, -(2**63), 2**32, 2**32 - 1]),
            torch.randint(-(2**62), 2**62, (9,), generator=g),
        ]
    )
    positions = torch.cat(
        [torch.tensor([0, 1, 2**31 - 1, 7, 4095, 123456, 2**31 - 2]), torch.randint(0, 2**31 - 1, (9,), generator=g)]
    )
    cols = torch.cat([torch.tensor([0, 1, 151935, 2**31 - 1]), torch.randint(0, 2**20, (12,), generator=g)])
    out = torch.ops.sgl_kernel.murmur_hash32_cpu.default(seeds, positions, cols)
    assert out.dtype == torch.uint32 and out.shape == (16, 16)
    got = out.to(torch.int64) & 0xFFFFFFFF
    for i, (s, p) in enumerate(zip(seeds.tolist(), positions.tolist())):
        for j, c in enumerate(cols.tolist()):
            key = struct.pack("<IIII", s & 0xFFFFFFFF, (s >> 32) & 0xFFFFFFFF, p, c)
            assert int(got[i, j]) == murmur3_x86_32(key, 0), (s, p, c)


def test_murmur_op_refuses_bad_shapes():
    with pytest.raises(ValueError, match="seed and positions"):
        sgl_kernel.murmur_hash32(torch.tensor([1, 2]), torch.tensor([1]), torch.tensor([0]))


def test_assign_req_to_token_pool_fills_each_requests_row_in_order():
    table = torch.full((5, 10), -1, dtype=torch.int32)
    rows, starts, ends = torch.tensor([3, 0, 4]), torch.tensor([2, 0, 5]), torch.tensor([5, 1, 9])
    locs = torch.arange(100, 108, dtype=torch.int64)
    sgl_kernel.assign_req_to_token_pool_cpu(rows, table, starts, ends, locs, 10)
    want = torch.full((5, 10), -1, dtype=torch.int32)
    want[3, 2:5] = torch.tensor([100, 101, 102], dtype=torch.int32)
    want[0, 0:1] = 103
    want[4, 5:9] = torch.tensor([104, 105, 106, 107], dtype=torch.int32)
    assert torch.equal(table, want)
    with pytest.raises(ValueError, match="ask for 8 locations"):
        sgl_kernel.assign_req_to_token_pool_cpu(rows, table, starts, ends, locs[:5], 10)


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer_reading_sources_first():
    g = torch.Generator().manual_seed(1)
    buffers = [torch.randn(12, 4, 8, generator=g).to(torch.bfloat16), torch.randn(12, 6, generator=g)]
    before = [b.clone() for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    src, tgt = torch.tensor([1, 2, 3, 9]), torch.tensor([2, 3, 7, 0])  # overlapping: 2 and 3 are both
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(buffers, before):
        want = old.clone()
        want[tgt] = old[src]
        assert torch.equal(b, want)


def test_speculative_names_exist_and_say_why_they_cannot_run():
    from sgl_kernel import build_tree_kernel_efficient_cpu, verify_tree_greedy_cpu  # noqa: F401

    with pytest.raises(NotImplementedError, match="speculative decoding does not run"):
        sgl_kernel.fill_bonus_tokens_cpu()
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")  # SGLang's AMX check must stay False
