"""TensorRT-LLM's relaxed MTP acceptance (``use_relaxed_acceptance_for_thinking``,
``relaxed_topk``, ``relaxed_delta``; first release 0.20.0 by date, PR
NVIDIA/TensorRT-LLM#3865): inside the thinking segment a draft is accepted when it is
among the verifier's ``relaxed_topk`` most probable tokens with probability at least
the top-1's minus ``relaxed_delta``; outside it the rule is strict greedy. The
thinking state is per request and carries across rounds, taken at round start (a
round-level rule with state, ``relaxtune.decoding.hooks``; the state is the one
definition of thinking of ``relaxtune.decoding.scope``, taken here at round start).

Source: CUDA kernel ``mtpRelaxedAcceptanceKernel``
(``cpp/tensorrt_llm/kernels/speculativeDecoding/mtpKernels.cu``, NVIDIA/TensorRT-LLM
index commit b35ac1b6, identical in the releases since 0.20.0), called through
``torch.ops.trtllm.mtp_relaxed_acceptance_op`` by
``tensorrt_llm/_torch/speculative/mtp.py`` ``MTPWorker.sample_and_accept_draft_tokens``
(index commit 23ee85ee), which passes ``torch.topk(torch.softmax(raw logits), relaxed_topk)``
(no temperature, top-k or top-p); knobs in ``tensorrt_llm.llmapi.MTPDecodingConfig``
(``relaxed_topk: int = 1`` (> 0), ``relaxed_delta: float = 0.0`` (>= 0)); notes in
``docs/reference/engine-rules.md`` section 2. Transcribed, not copied.

Greedy-only as the engine runs it: request temperature/top-p are ignored on this
path, the correction ("golden") and bonus tokens are the verifier's argmax, and no
random numbers are drawn. relaxtune runs it at T = 0, where its residual and bonus
(from the one-hot ``p``) are that argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .hooks import RoundContext, RoundRule
from .rules import Rows, Targets
from .scope import ThinkingState, advance_thinking

__all__ = [
    "TRT_TOPK",
    "TRT_DELTA",
    "TRT_PRESET_TOPK",
    "BEGIN_THINKING",
    "END_THINKING",
    "ThinkingState",
    "trtllm_thinking_state",
    "trtllm_relaxed",
    "trtllm_accept",
    "trtllm_advance",
    "TRTLLM_RULE",
]

TRT_TOPK = "relaxed_topk"
TRT_DELTA = "relaxed_delta"
TRT_PRESET_TOPK = 10  # NVIDIA's published preset (blog 2025-05-23): relaxed_topk 10, relaxed_delta 0.6
BEGIN_THINKING = 128798  # DeepSeek-R1 <think>: the engine's default begin_thinking_phase_token
END_THINKING = 128799  # DeepSeek-R1 </think>: end_thinking_phase_token


def trtllm_thinking_state(
    prompts: Sequence[Sequence[int]], begin_id: int = BEGIN_THINKING, end_id: int = END_THINKING
) -> ThinkingState:
    """The state after prefill: a sequence starts inside thinking iff its prompt
    holds the begin token at least once (end tokens in the prompt are ignored, as
    the engine's ``ctx_delta = (count(begin) >= 1) * relaxed_delta``)."""
    thinking = torch.tensor([begin_id in list(ids) for ids in prompts], dtype=torch.bool)
    return ThinkingState(thinking, int(begin_id), int(end_id))


def trtllm_relaxed(rows: Rows, knobs: Any = None) -> Targets:
    """The per-position view: ``pi_rej = pi_res = p``. At T = 0 ``p`` is the one-hot
    argmax, so the residual after the first rejection and the bonus token are the
    verifier's argmax: the kernel's golden token ``topKIndices[n][0]``. The relaxed
    accept test reads the raw logits and the thinking state: ``trtllm_accept``."""
    return Targets(rows.p, rows.p)


def trtllm_accept(ctx: RoundContext) -> torch.Tensor:
    """The kernel's verdicts, ``[B, N]`` bool: with ``P = softmax(z_p)`` (raw logits,
    float32) and its ``relaxed_topk`` largest values ``v_0 >= v_1 >= ...`` (ids
    ``i_0, i_1, ...``), the draft at a position is accepted iff it equals some
    ``i_j`` with ``j = 0`` or ``v_j >= v_0 - d``, where ``d = relaxed_delta`` for a
    sequence inside thinking at round start and 0 outside (then only the argmax and
    exact ties pass: strict greedy).

    Raises:
        ValueError: without ``z_p`` or without a ``ThinkingState`` of ``B`` rows.
    """
    if ctx.z_p is None:
        raise ValueError("trtllm_relaxed needs the raw verifier logits z_p (the engine reads softmax(raw logits))")
    state = ctx.state
    b, n = ctx.x.shape
    if not isinstance(state, ThinkingState) or tuple(state.thinking.shape) != (b,):
        raise ValueError(f"trtllm_relaxed needs a ThinkingState of {b} sequences (trtllm_thinking_state(prompts))")
    probs = ctx.z_p[:, :n].float().softmax(-1)
    k = min(int(ctx.knobs[TRT_TOPK]), probs.shape[-1])
    val, idx = probs.topk(k, dim=-1)
    delta = torch.where(state.thinking, float(ctx.knobs[TRT_DELTA]), 0.0).to(val.dtype)
    keep = val >= (val[..., :1] - delta[:, None, None])
    keep[..., 0] = True
    return ((idx == ctx.x.unsqueeze(-1)) & keep).any(-1)


trtllm_advance = advance_thinking  # the kernel's phase flip after a round: the later delimiter wins


TRTLLM_RULE = RoundRule(
    accept=trtllm_accept,
    advance=trtllm_advance,
    needs_state=True,
    thinking_scoped=True,
    start=trtllm_thinking_state,
    initial_state="relaxtune.decoding.trtllm.trtllm_thinking_state(prompt_ids, begin_id, end_id)",
)
