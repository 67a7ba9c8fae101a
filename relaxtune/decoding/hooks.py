"""The round-level hook: for rules whose verdict at one drafted position depends
on later positions of the same round (vLLM's FLy look-ahead window) or on state
carried across rounds (TensorRT-LLM's thinking phase, taken at round start as its
kernel does).

A per-position rule gives ``pi_rej(x)`` and the round tests ``u_i < pi_rej(x_i) /
q_i(x_i)`` position by position (``relaxtune.decoding.round``). A round rule sees
the whole round at once (``RoundContext``: rows, drafts, uniforms, the native
per-position verdict, the named knobs, the state) and returns the verdict of every
position, ``[B, N]`` bool; the round then keeps the leading accepts, emits the
residual ``norm((pi_res - q)+)`` of the method's ``targets`` at the first rejection
(or the bonus token from ``p``) with the same ``N + 1`` uniforms, and calls
``advance`` on the emitted tokens to carry the state into the next round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["RoundContext", "RoundRule"]


@dataclass(frozen=True)
class RoundContext:
    """What a round rule sees.

    Attributes:
        p: verifier rows ``[B, N+1, V]`` after the sampling transform.
        q: drafter rows ``[B, N, V]`` (or ``[B, N+1, V]``).
        x: drafted ids ``[B, N]`` int64.
        uniforms: the round's ``[B, N+1]`` uniforms in ``[0, 1)``.
        native: ``[B, N]`` bool, the per-position test of the method's ``rej_at``
            (``q(x) > 0 and u < pi_rej(x) / q(x)``), before the leading-accept cut.
        knobs: the named knob values (``MethodSpec.named``).
        z_p, z_q: raw logits ``[B, N+1, V]`` (None when not supplied).
        temperature: the sampling transform's T (0: greedy).
        state: the per-sequence state at round start (None when the rule has none).
    """

    p: torch.Tensor
    q: torch.Tensor
    x: torch.Tensor
    uniforms: torch.Tensor
    native: torch.Tensor
    knobs: dict[str, Any]
    z_p: torch.Tensor | None = None
    z_q: torch.Tensor | None = None
    temperature: float | None = None
    state: Any = None


@dataclass(frozen=True)
class RoundRule:
    """A round-level rule.

    Attributes:
        accept: ``RoundContext -> [B, N]`` bool verdicts (the round keeps the
            leading run of True).
        check: ``(N, knobs) -> None``, raising ValueError for a draft length the
            engine refuses (FLy: N >= 2, window < N); None: any N.
        advance: ``(state, tokens [B, N+1] padded with -1, num_emitted [B], knobs)
            -> state`` after the round; None for stateless rules.
        needs_state: the round refuses ``state=None`` (naming ``initial_state``).
        initial_state: one line naming the function that builds the state.
        start: ``(prompts, begin_id, end_id) -> state``, the state after prefill, for
            rules keyed on thinking (the engine builds it from each prompt); None
            for other rules.
        thinking_scoped: the rule keys its relaxation on the thinking state itself
            (``relaxtune.decoding.scope.ThinkingState``, at round start as its engine
            does: TensorRT-LLM); a scope ``"thinking"`` round takes its verdicts as they
            are instead of masking them position by position.
    """

    accept: Callable[[RoundContext], torch.Tensor]
    check: Callable[[int, dict[str, Any]], None] | None = None
    advance: Callable[..., Any] | None = None
    needs_state: bool = False
    initial_state: str = ""
    thinking_scoped: bool = False
    start: Callable[..., Any] | None = None
