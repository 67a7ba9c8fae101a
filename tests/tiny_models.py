"""Tiny randomly initialised causal LMs built from configs (no downloads)."""

from __future__ import annotations

import copy
import functools

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from relaxtune.backends.hf import HFBackend


def tiny_lm(vocab: int = 64, seed: int = 0, scale: float = 1.0) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 model in float32, with output logits scaled by ``scale``."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def noisy_copy(model, noise: float, seed: int = 1):
    """A drafter: the verifier with Gaussian noise on every weight."""
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp_min(1e-3))
    return out


@functools.cache
def tiny_pair(vocab: int = 64, noise: float = 0.5, scale: float = 30.0) -> HFBackend:
    """A verifier and a noisy-copy drafter sharing a vocabulary."""
    verifier = tiny_lm(vocab, scale=scale)
    return HFBackend(noisy_copy(verifier, noise), verifier, name=f"tiny-{vocab}")


SPECIALS = ["<eos>", "<user>", "<assistant>"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789") + ["\u0120", "\u010a"] + list(".,:;!?()[]{}=+-*/_'\"#<>")
VOCAB = SPECIALS + CHARS  # 64 ids; byte-level characters (\u0120 is a space, \u010a a newline)
CHAT_TEMPLATE = (
    "{% for m in messages %}<user>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def tiny_tokenizer(vocab: list[str] = VOCAB):
    """A character-level byte-level BPE tokenizer over ``VOCAB`` (64 ids, no merges)
    with a chat template: loads the same way whatever class transformers picks."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE({w: i for i, w in enumerate(vocab)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[1:]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tiny_model(path, seed: int = 0, noise: float = 0.0, vocab: list[str] = VOCAB) -> str:
    """Save a tiny model (a noisy copy when ``noise`` > 0) and the tokenizer to ``path``."""
    model = tiny_lm(vocab=len(VOCAB), seed=seed, scale=10.0)
    if noise:
        model = noisy_copy(model, noise)
    model.config.eos_token_id = 0
    model.generation_config.eos_token_id = 0
    model.save_pretrained(path)
    tiny_tokenizer(vocab).save_pretrained(path)
    return str(path)
