"""What the engine benchmark's tables share: the prompts, the paper's sampling
transform, the embedded pair's architectures for ``--random-weights``, the backend
and prompts of a run (``build``), transformers' own ``generate`` (``hf_generate``),
and the median and spread of repeated figures (``fmt``).
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from relaxtune.backends.embedded import DRAFTER, VERIFIER
from relaxtune.backends.hf import HFBackend, load_pair
from relaxtune.decoding.sampling import SamplingParams

__all__ = [
    "PROMPTS",
    "PAPER",
    "NOISY",
    "median_spread",
    "fmt",
    "sync",
    "random_model",
    "build",
    "hf_generate",
    "chat_ids",
]

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that returns the prime factors of an integer.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that parses a CSV line with quoted fields.",
]
PAPER = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
NOISY = 0.10  # a spread above this marks a disturbed figure
# the embedded pair's architectures (Qwen2.5-Coder-0.5B / 1.5B-Instruct), for --random-weights
ARCH = {
    DRAFTER.name: dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    VERIFIER.name: dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
}
QWEN2 = dict(
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
    max_position_embeddings=32768,
    rope_theta=1e6,
)


def median_spread(values: list[float]) -> tuple[float, float]:
    """Median of repeated measurements and their spread ``(max - min) / median``."""
    mid = statistics.median(values)
    return mid, (max(values) - min(values)) / mid if mid else 0.0


def fmt(values: list[float], digits: int = 2) -> str:
    """``median ±spread%`` (with ``!`` when the spread marks a disturbed run)."""
    mid, spread = median_spread(values)
    return f"{mid:.{digits}f} ±{spread:.0%}{'!' if spread > NOISY else ''}"


def sync(device) -> None:
    """Wait for queued GPU work before reading the clock."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def chat_ids(tokenizer, text: str) -> list[int]:
    """The ids of ``text`` as one user message in ``tokenizer``'s chat template (generation prompt added)."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def random_model(name_or_dir: str, dtype: torch.dtype, device: str, seed: int = 0):
    """A causal LM with random weights (seeded): an embedded name's architecture,
    or a folder's ``config.json``."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = (
        Qwen2Config(**QWEN2, **ARCH[name_or_dir]) if name_or_dir in ARCH else AutoConfig.from_pretrained(name_or_dir)
    )
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def build(args) -> tuple[HFBackend, list[list[int]]]:
    """The backend (EOS ignored) and the prompts' ids."""
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if args.random_weights:
        dtype = getattr(torch, args.dtype)
        drafter, verifier = (
            random_model(m, dtype, device, seed) for seed, m in enumerate((args.drafter, args.verifier))
        )
        backend = HFBackend(drafter, verifier, name=f"random {args.drafter}->{args.verifier}")
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(backend.vocab_size, (30 + 3 * i,), generator=g).tolist() for i in range(args.prompts)]
    else:
        backend = load_pair(args.drafter, args.verifier, dtype=args.dtype, device=device)
        prompts = [chat_ids(backend.tokenizer, p) for p in (PROMPTS * args.prompts)[: args.prompts]]
    backend.eos_token_ids = frozenset()  # fixed-length runs
    return backend, prompts


def hf_generate(
    backend: HFBackend, batch: list[list[int]], max_new: int, n_draft: int | None = None, seed: int = 0
) -> int:
    """transformers ``generate`` on ``batch`` (left-padded), with the assistant at draft
    length ``n_draft`` when given (else AR); returns new tokens.

    Fixed lengths as relaxtune's runs have them (``eos_token_ids`` empty: EOS is sampled
    like any token and ends nothing): ``eos_token_id=None`` for the verifier and the
    assistant alike. Only what ``generate()`` takes from its keywords is passed as one:
    no ``min_new_tokens`` (its logits processor would be built twice in assisted
    generation, and it would take EOS out of the distribution); the assistant's draft
    length, schedule and confidence threshold are read from the assistant's own
    generation config, so they are pinned there (``relaxtune.report.deploy.assistant_config``).
    """
    from relaxtune.backends.transformers_compat import pinned_generation_config
    from relaxtune.report.deploy import assistant_config

    kw = dict(
        do_sample=True,
        temperature=PAPER.temperature,
        top_k=PAPER.top_k,
        top_p=PAPER.top_p,
        max_new_tokens=max_new,
        eos_token_id=None,
        pad_token_id=0,
    )
    assistant = contextlib.nullcontext()
    if n_draft is not None:
        kw["assistant_model"] = backend.drafter
        assistant = pinned_generation_config(backend.drafter, assistant_config(n_draft) | {"eos_token_id": None})
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=backend.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=backend.device)
    torch.manual_seed(seed)
    with torch.inference_mode(), assistant:
        out = backend.verifier.generate(ids, attention_mask=mask, **kw)
    sync(backend.device)
    return (out.shape[1] - width) * len(batch)
