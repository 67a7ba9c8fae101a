"""Tiny random Qwen2 GGUF models for the llama.cpp backend's tests, written with the ``gguf`` package.

``write_tiny_gguf`` writes a 2-layer Qwen2 model with random float32 weights and a
byte-level BPE vocabulary (no merges) that llama.cpp loads like any GGUF. A
drafter is the same weights with Gaussian noise (``noise``), so the pair's
distributions are close but differ, as a real pair's do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def vocab_of(path: str | Path) -> dict:
    """A GGUF's vocabulary as ``write_tiny_gguf`` keywords: ``vocab`` (token texts),
    ``token_types``, ``merges``, ``pre`` and ``eos``."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    get = lambda key: fields[key].contents() if key in fields else None  # noqa: E731
    return dict(
        vocab=get("tokenizer.ggml.tokens"),
        token_types=get("tokenizer.ggml.token_type"),
        merges=get("tokenizer.ggml.merges") or [],
        pre=get("tokenizer.ggml.pre") or "default",
        eos=get("tokenizer.ggml.eos_token_id"),
    )


def write_tiny_gguf(
    path: str | Path,
    vocab: list[str],
    *,
    seed: int = 0,
    noise: float = 0.0,
    noise_seed: int = 1,
    control: int = 0,
    token_types: list[int] | None = None,
    merges: list[str] = (),
    pre: str = "qwen2",
    eos: int | None = None,
    scale: float = 0.3,
    out_scale: float = 1.0,
    n_embd: int = 32,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 64,
    n_ctx: int = 1024,
) -> Path:
    """Write a tiny random Qwen2 GGUF (float32) to ``path`` and return it.

    Args:
        vocab: the token texts (byte-level: ``Ġ`` a space, ``Ċ`` a newline); the
            first ``control`` of them are control tokens (or ``token_types`` gives
            every token's type); merges / pre: the BPE merges and pre-tokenizer.
        seed: the weights' seed; noise: standard deviation of the noise added to
            every weight (relative to ``scale``), drawn with ``noise_seed``.
        eos: the end-of-sequence id (None: none named).
        scale: the weights' standard deviation; out_scale: extra factor on the
            output projection (larger gives peakier next-token distributions).
        n_embd / n_layer / n_head / n_head_kv / n_ff / n_ctx: the architecture.
    """
    import gguf

    base, jitter = np.random.default_rng(seed), np.random.default_rng(noise_seed)

    def w(*shape: int, factor: float = 1.0) -> np.ndarray:
        x = base.standard_normal(shape) + noise * jitter.standard_normal(shape)
        return (x * scale * factor).astype(np.float32)

    v, kv = len(vocab), (n_embd // n_head) * n_head_kv
    out = gguf.GGUFWriter(str(path), "qwen2")
    out.add_name("tiny-random-qwen2")
    out.add_context_length(n_ctx)
    out.add_embedding_length(n_embd)
    out.add_block_count(n_layer)
    out.add_feed_forward_length(n_ff)
    out.add_head_count(n_head)
    out.add_head_count_kv(n_head_kv)
    out.add_rope_freq_base(10000.0)
    out.add_layer_norm_rms_eps(1e-6)
    out.add_file_type(gguf.LlamaFileType.ALL_F32)
    out.add_tokenizer_model("gpt2")
    out.add_tokenizer_pre(pre)
    out.add_token_list(vocab)
    out.add_token_types(
        list(token_types)
        if token_types is not None
        else [gguf.TokenType.CONTROL] * control + [gguf.TokenType.NORMAL] * (v - control)
    )
    out.add_token_merges(list(merges) or [f"{vocab[-2]} {vocab[-1]}"])  # llama.cpp needs at least one merge
    if eos is not None:
        out.add_eos_token_id(eos)
    out.add_add_bos_token(False)
    ones = np.ones(n_embd, dtype=np.float32)
    out.add_tensor("token_embd.weight", w(v, n_embd, factor=1 / scale))
    out.add_tensor("output_norm.weight", ones)
    out.add_tensor("output.weight", w(v, n_embd, factor=out_scale))
    for i in range(n_layer):
        for name, shape in (
            ("attn_q.weight", (n_embd, n_embd)),
            ("attn_q.bias", (n_embd,)),
            ("attn_k.weight", (kv, n_embd)),
            ("attn_k.bias", (kv,)),
            ("attn_v.weight", (kv, n_embd)),
            ("attn_v.bias", (kv,)),
            ("attn_output.weight", (n_embd, n_embd)),
            ("ffn_gate.weight", (n_ff, n_embd)),
            ("ffn_up.weight", (n_ff, n_embd)),
            ("ffn_down.weight", (n_embd, n_ff)),
        ):
            out.add_tensor(f"blk.{i}.{name}", w(*shape))
        out.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        out.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return Path(path)
