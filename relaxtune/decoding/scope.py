"""The relaxation scope: where in a response a relaxed rule may relax.

Scope ``"all"`` relaxes at every drafted position (the rule as the paper states it).
Scope ``"thinking"`` relaxes only inside the thinking segment (between ``<think>``
and ``</think>``) and verifies strictly in the answer: at a drafted position inside
thinking the round uses the method's own verdict and residual; at a position outside
it uses strict speculative sampling's (accept iff ``u < p(x) / q(x)``, residual
``norm((p - q)+)``, bonus from ``p``), with the same ``N + 1`` uniforms. So with no
thinking token in the prompt or the round the round is strict bit for bit, and inside
thinking it is the method's bit for bit (``relaxtune.decoding.round.verify_rounds``).

One definition of "inside the thinking segment" per drafted position (this module):
a sequence's state at round start (``ThinkingState``: after prefill, ``thinking_state``;
after each round, ``advance_thinking`` over the emitted tokens) and, inside the round,
the drafts before the position: position ``i`` (1-based, ``N + 1`` the bonus) is inside
iff the last delimiter among the state and ``x_1 .. x_{i-1}`` opened thinking. This is
exact: a verdict at position ``i`` matters only when ``x_1 .. x_{i-1}`` were all
accepted, so they are the response's prefix there. A ``</think>`` drafted inside thinking
is itself decided by the relaxed rule (its position is still inside) and ends the
relaxed region from the next position on.

TensorRT-LLM's relaxed MTP acceptance keys its relaxation on the same state, taken at
round start only, as its kernel does (``relaxtune.decoding.trtllm``; its rule is
``RoundRule.thinking_scoped``): a ``</think>`` drafted mid-round leaves the rest of that
round relaxed there, and its state after prefill counts ``<think>`` in the prompt
(``trtllm_thinking_state``). It shares ``ThinkingState`` and ``advance_thinking``.

Scope is refused for a task that does not think (``TaskSpec.thinks``): naming the
flag, the value and the task (``check_scope``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "Scope",
    "SCOPES",
    "SCOPE_CHOICES",
    "SCOPE_FLAG",
    "NO_THINK_ID",
    "ThinkingState",
    "thinking_state",
    "inside_thinking",
    "advance_thinking",
    "scopes_of",
    "check_scope",
]

Scope = Literal["all", "thinking"]
SCOPES: tuple[str, ...] = ("all", "thinking")  # what a point (record, trial, export) carries
SCOPE_CHOICES: tuple[str, ...] = (*SCOPES, "both")  # the setting: "both" searches scope as a dimension
SCOPE_FLAG = "--relaxation-scope"
NO_THINK_ID = -1  # a delimiter id no token has: a model without thinking tokens is never inside


@dataclass(frozen=True)
class ThinkingState:
    """Per-sequence thinking state at round start (TensorRT-LLM: the engine's
    ``mtp_relaxed_delta_pool`` slot, ``relaxed_delta`` inside thinking, 0 outside).

    Attributes:
        thinking: ``[B]`` bool, inside the thinking segment at round start.
        begin_id, end_id: the thinking delimiters' token ids (the model's
            ``<think>``/``</think>``; ``NO_THINK_ID`` for a model without them).
    """

    thinking: torch.Tensor
    begin_id: int = NO_THINK_ID
    end_id: int = NO_THINK_ID


def thinking_state(
    prompts: Sequence[Sequence[int]], begin_id: int = NO_THINK_ID, end_id: int = NO_THINK_ID
) -> ThinkingState:
    """The exact state after prefill: a sequence starts inside thinking iff the last
    thinking delimiter of its prompt is ``begin_id`` (a chat template that opens
    thinking ends its prompt with ``<think>``; one that turns it off writes an empty
    ``<think></think>``, outside). A prompt without delimiters starts outside.

    Args:
        prompts: token ids per sequence (B of them).
        begin_id, end_id: the delimiters' ids.

    Returns:
        ``ThinkingState`` with ``thinking`` ``[B]``.
    """
    out = []
    for ids in prompts:
        marks = [t for t in ids if t in (begin_id, end_id)]
        out.append(bool(marks) and marks[-1] == begin_id)
    return ThinkingState(torch.tensor(out, dtype=torch.bool), int(begin_id), int(end_id))


def inside_thinking(state: ThinkingState, x: torch.Tensor) -> torch.Tensor:
    """Which positions of a round are inside thinking, ``[B, N+1]`` bool: position
    ``i`` (0-based; ``N`` is the bonus) is inside iff the last delimiter among the
    state at round start and the drafts ``x[:, :i]`` opened thinking.

    Args:
        state: the state at round start, ``B`` sequences.
        x: drafted ids ``[B, N]``.

    Raises:
        ValueError: a state of another batch size.
    """
    b, n = x.shape
    if tuple(state.thinking.shape) != (b,):
        raise ValueError(f"the thinking state holds {tuple(state.thinking.shape)} sequences, the round {b}")
    flips = (x == state.begin_id) | (x == state.end_id)
    # the last delimiter at or before each draft: index + 1, 0 = none yet; carried forward by cummax
    steps = torch.arange(1, n + 1, device=x.device).expand(b, n)
    last = torch.where(flips, steps, 0).cummax(-1).values
    at = x.gather(-1, (last - 1).clamp_min(0))
    after = torch.where(last > 0, at == state.begin_id, state.thinking.unsqueeze(-1))  # state after draft i
    return torch.cat([state.thinking.unsqueeze(-1), after], -1)


def advance_thinking(
    state: ThinkingState, tokens: torch.Tensor, num_emitted: torch.Tensor, knobs=None
) -> ThinkingState:
    """The state after a round: the emitted tokens (accepted drafts, then the residual
    or bonus token) in order; ``begin_id`` enters thinking, ``end_id`` leaves it, the
    later one wins (TensorRT-LLM's kernel flips its phase the same way).

    Args:
        state: the state at round start; tokens: ``[B, N+1]`` emitted ids padded with -1;
        num_emitted: ``[B]``; knobs: ignored (the ``RoundRule.advance`` signature).
    """
    steps = torch.arange(tokens.shape[1])
    valid = steps < num_emitted.unsqueeze(-1)
    flips = valid & ((tokens == state.begin_id) | (tokens == state.end_id))
    last = torch.where(flips, steps + 1, 0).amax(-1)  # 1-based position of the last flip, 0 = none
    at = tokens.gather(-1, (last - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1)
    thinking = torch.where(last > 0, at == state.begin_id, state.thinking)
    return ThinkingState(thinking, state.begin_id, state.end_id)


def scopes_of(setting: str) -> tuple[str, ...]:
    """The scopes a setting of ``SCOPE_FLAG`` searches: ``("all",)``, ``("thinking",)``
    or both for ``"both"``.

    Raises:
        ValueError: a value outside ``SCOPE_CHOICES``.
    """
    if setting not in SCOPE_CHOICES:
        raise ValueError(f"{SCOPE_FLAG} {setting!r}: choose one of {', '.join(SCOPE_CHOICES)}")
    return SCOPES if setting == "both" else (setting,)


def check_scope(setting: str, task: str, thinks: bool) -> None:
    """Refuse a thinking scope (``thinking`` or ``both``) for a task that does not think.

    Raises:
        ValueError: naming the flag, the value and the task.
    """
    if "thinking" in scopes_of(setting) and not thinks:
        raise ValueError(
            f"{SCOPE_FLAG} {setting}: task {task} does not think (no prompt.thinking, no thinking_budget), "
            "so it has no thinking segment to relax in; use all"
        )
