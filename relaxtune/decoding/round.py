"""One speculative verification round, for one sequence or a batch.

The generalised round of Xia, Ribar and Balanca (arXiv 2607.08690, 2026), as in
``docs/concepts/relaxed-rules.md``, "One speculative round":

    for i in 1..N: accept x_i iff q_i(x_i) > 0 and u_i < pi_rej_i(x_i) / q_i(x_i)
                   else emit y ~ norm((pi_res_i - q_i)+) and end the round
    if all N accepted: emit the bonus token ~ pi_bonus at position N+1

The test uses a strict ``<`` on ``u ~ U[0, 1)``: ``P(u < r) = min(1, r)`` exactly,
and a target of zero (``pi_rej(x) = 0``) can never accept. A residual with zero
mass (the test could not have rejected, up to float error) falls back to
``pi_res`` itself. A residual or bonus row that is not finite (NaN or inf: a
method fed rows outside its domain) never yields a token: the round raises.

Randomness: a round consumes exactly ``N + 1`` uniforms per sequence, whatever
the method and the outcome (``u_1..u_N`` for the accept tests, ``u_{N+1}`` for the
residual or bonus token, sampled by inverse CDF). So methods at their strict
point reproduce ``strict`` bit for bit under the same seed, and callers can pass
per-sequence uniforms (common random numbers across methods).

Round-level rules (``MethodSpec.round_rule``, ``relaxtune.decoding.hooks``: vLLM's
FLy, TensorRT-LLM's relaxed MTP acceptance) replace the per-position verdicts by
their own, computed from the whole round (and a ``state`` carried across rounds,
returned in the result); everything else (leading accepts, residual, bonus, the
``N + 1`` uniforms) is the same path. Per-position rules never enter the hook.

Relaxation scope (``relaxtune.decoding.scope``): at scope ``"thinking"`` the round
keeps the method's verdict, residual and bonus at the positions inside the thinking
segment and takes strict's (``u < p(x) / q(x)``, ``norm((p - q)+)``, bonus from ``p``)
at the others, with the same uniforms; the state (``ThinkingState``) is carried
across rounds in the result. A rule keyed on thinking by itself
(``RoundRule.thinking_scoped``: TensorRT-LLM's, at round start) runs as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .hooks import RoundContext
from .methods import MethodSpec, Needs, Rows, get_method
from .sampling import draw_uniforms, sample_from_rows
from .scope import SCOPES, ThinkingState, advance_thinking, inside_thinking

__all__ = ["RoundResult", "BatchRoundResult", "verify_round", "verify_rounds", "check_distribution"]

ROW_SUM_TOL = 1e-3  # |sum(row) - 1| allowed for a probability row


@dataclass(frozen=True)
class RoundResult:
    """Outcome of one round for one sequence.

    Attributes:
        tokens: emitted token ids (1 to N+1 of them): the accepted drafts, then the
            residual or bonus token.
        accepted: number of accepted drafted tokens (the residual/bonus token is
            not counted).
        state: a round-level rule's state after the round (None otherwise).
    """

    tokens: list[int]
    accepted: int
    state: Any = None


@dataclass(frozen=True)
class BatchRoundResult:
    """Outcome of one round for a batch of B sequences (ragged acceptance).

    Attributes:
        tokens: ``[B, N+1]`` int64 emitted ids, left-aligned, padded with -1.
        num_emitted: ``[B]`` tokens emitted per sequence (``accepted + 1``).
        accepted: ``[B]`` accepted drafts per sequence.
        state: a round-level rule's per-sequence state after the round, for the
            next round (None for rules without state).
    """

    tokens: torch.Tensor
    num_emitted: torch.Tensor
    accepted: torch.Tensor
    state: Any = None

    def row(self, b: int) -> RoundResult:
        """The result of sequence ``b`` as a ``RoundResult``."""
        n = int(self.num_emitted[b])
        return RoundResult(self.tokens[b, :n].tolist(), int(self.accepted[b]))


def check_distribution(name: str, rows: torch.Tensor, tol: float = ROW_SUM_TOL) -> None:
    """Check that every row of ``rows`` ``[..., V]`` is a probability distribution.

    Raises:
        ValueError: naming ``name`` and the first bad row, for NaN/inf entries,
            negative entries, or a row sum off 1 by more than ``tol``.
    """
    if not rows.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {rows.dtype}")
    flat = rows.reshape(-1, rows.shape[-1])
    sums = flat.sum(-1, dtype=torch.float64)
    bad = ~torch.isfinite(sums)
    if bad.any():
        raise ValueError(f"{name} row {int(bad.nonzero()[0])} contains NaN or inf")
    neg = flat.amin(-1) < 0
    if neg.any():
        raise ValueError(f"{name} row {int(neg.nonzero()[0])} has negative entries")
    off = (sums - 1.0).abs() > tol
    if off.any():
        i = int(off.nonzero()[0])
        raise ValueError(f"{name} row {i} sums to {float(sums[i]):.6g}, not 1 (tolerance {tol})")


def _check_shapes(p, q, draft_ids, z_p, z_q) -> tuple[int, int, int]:
    if p.dim() != 3:
        raise ValueError(f"p must be [B, N+1, V], got shape {tuple(p.shape)}")
    b, n1, v = p.shape
    n = n1 - 1
    if n < 1:
        raise ValueError("N = 0: a speculative round needs at least one drafted token (p must be [B, N+1, V], N >= 1)")
    if q.dim() != 3 or q.shape[0] != b or q.shape[2] != v or q.shape[1] not in (n, n1):
        raise ValueError(f"q must be [B, N, V] or [B, N+1, V] = [{b}, {n}|{n1}, {v}], got {tuple(q.shape)}")
    if tuple(draft_ids.shape) != (b, n):
        raise ValueError(f"draft_ids must be [B, N] = [{b}, {n}], got {tuple(draft_ids.shape)}")
    if draft_ids.numel() and (int(draft_ids.min()) < 0 or int(draft_ids.max()) >= v):
        raise ValueError(f"draft_ids must lie in [0, V = {v})")
    for name, z, width in (("z_p", z_p, (n1,)), ("z_q", z_q, (n, n1))):
        if z is not None and (z.dim() != 3 or z.shape[0] != b or z.shape[2] != v or z.shape[1] not in width):
            raise ValueError(f"{name} must be [B, {'|'.join(map(str, width))}, V], got {tuple(z.shape)}")
    return b, n, v


def _check_needs(spec: MethodSpec, knob: float | None, q, z_p, z_q, temperature, n: int, draft_ids) -> None:
    """Raise when the method at this knob lacks an input its ``needs`` names."""
    if spec.is_strict(knob):
        return
    if Needs.GREEDY_DRAFTS in spec.needs:
        q_x = q[:, :n].gather(-1, draft_ids.long().unsqueeze(-1))
        if bool((q_x < 1.0 - ROW_SUM_TOL).any()):
            raise ValueError(
                f"{spec.id} treats drafts as deterministic (SGLang's target-only rule): draft the "
                "drafter's argmax and pass one-hot q rows"
            )
    if Needs.VERIFIER_LOGITS in spec.needs and z_p is None:
        raise ValueError(f"{spec.id} needs the raw verifier logits z_p [B, N+1, V]")
    if Needs.DRAFTER_LOGITS in spec.needs and z_q is None:
        raise ValueError(f"{spec.id} needs the raw drafter logits z_q [B, N+1, V]")
    if Needs.EXTRA_DRAFTER_STEP in spec.needs and (q.shape[1] != n + 1 or z_q.shape[1] != n + 1):
        raise ValueError(
            f"{spec.id} draws its bonus token from pi at position N+1: q and z_q must be "
            "[B, N+1, V] (one extra drafter step after the last draft)"
        )
    if Needs.DRAFTER_LOGITS in spec.needs and not temperature:
        raise ValueError(f"{spec.id} needs the sampling temperature (> 0)")


def _refuse(spec: MethodSpec, what: str, seqs: torch.Tensor, pos: torch.Tensor) -> None:
    """Raise for non-finite rows about to be sampled (sequences ``seqs`` at positions ``pos``)."""
    raise ValueError(
        f"{spec.id}: the {what} row of sequence {int(seqs[0])} at position {int(pos[0])} is not a finite "
        f"distribution (NaN or inf), so no token is emitted from it ({len(seqs)} such row(s)); the method "
        "was fed rows outside its domain (check the logit rows for NaN, +inf or all -inf entries)"
    )


def _take(t: torch.Tensor | None, rows: torch.Tensor, pos: torch.Tensor | int) -> torch.Tensor | None:
    """Rows ``t[rows, pos]`` ``[R, V]`` of ``t`` ``[B, S, V]`` (``index_select`` on the
    flattened tensor: a row copy, much faster than advanced indexing)."""
    if t is None:
        return None
    if rows.numel() == 1:  # a view, no copy
        return t[int(rows), int(pos)].unsqueeze(0)
    return t.flatten(0, 1).index_select(0, rows * t.shape[1] + pos)


def verify_rounds(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_ids: torch.Tensor,
    method: str | MethodSpec,
    knob: float | None = None,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    z_p: torch.Tensor | None = None,
    z_q: torch.Tensor | None = None,
    temperature: float | None = None,
    validate: bool = True,
    state: Any = None,
    scope: str = "all",
) -> BatchRoundResult:
    """Run one verification round for each of B sequences.

    Args:
        p: verifier probabilities ``[B, N+1, V]`` (drafted positions, then bonus).
        q: drafter probabilities ``[B, N, V]``, or ``[B, N+1, V]`` with the row after
            the last draft (needed by ``spec_cont_dec``'s bonus).
        draft_ids: drafted tokens ``[B, N]`` (int64), ``x_i ~ q_i``.
        method: a method id of ``METHODS`` or its spec.
        knob: the method's knob (None for ``strict`` / ``always_accept``): alpha, or
            a mapping of its named knobs (``MethodSpec.knobs``).
        generator: source of the uniforms when ``uniforms`` is None.
        uniforms: ``[B, N+1]`` uniforms in ``[0, 1)`` to use instead (per-sequence
            common random numbers).
        z_p, z_q: raw logits ``[B, N+1, V]`` (``z_q`` may be ``[B, N, V]``), for
            ``spec_casc_tok`` and ``spec_cont_dec``.
        temperature: the sampling transform's T; 0 is refused for methods that
            collapse to strict under greedy decoding; needed by ``spec_cont_dec``.
        validate: check that p and q rows are distributions (one pass over them;
            backends that build rows with ``relaxtune.decoding.sampling`` may skip it).
        state: a round-level rule's per-sequence state at round start (e.g.
            ``relaxtune.decoding.trtllm.ThinkingState``); pass the previous result's
            ``state`` to the next round.
        scope: ``"all"`` (relax at every position) or ``"thinking"`` (relax inside the
            thinking segment only, strict elsewhere; ``state`` must then be a
            ``relaxtune.decoding.scope.ThinkingState``, from ``thinking_state``).

    Returns:
        ``BatchRoundResult`` (tokens ``[B, N+1]`` padded with -1; ``state`` after the round).

    Raises:
        ValueError: unknown method, knob out of range, T = 0 for a method that
            refuses it, N = 0, shape mismatch, rows that are not distributions,
            missing logits, bad uniforms; a residual or bonus row that is NaN or
            inf where a token would be sampled from it; a draft length or a
            missing state that a round-level rule refuses; an unknown scope, or scope
            ``"thinking"`` without a ``ThinkingState`` of B sequences.
    """
    spec = get_method(method)
    hook = spec.round_rule
    knob = spec.check_knob(knob)
    spec.check_temperature(temperature)
    b, n, v = _check_shapes(p, q, draft_ids, z_p, z_q)
    _check_needs(spec, knob, q, z_p, z_q, temperature, n, draft_ids)
    named = None
    if hook is not None:
        named = spec.named(knob)
        if hook.check is not None:
            hook.check(n, named)
        if hook.needs_state and state is None:
            raise ValueError(
                f"{spec.id} carries state across rounds: pass state= (from {hook.initial_state}, "
                "then each round's result.state)"
            )
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    scoped = scope == "thinking"
    if scoped and not (isinstance(state, ThinkingState) and tuple(state.thinking.shape) == (b,)):
        raise ValueError(
            f"scope thinking needs state= a ThinkingState of {b} sequences (from "
            "relaxtune.decoding.scope.thinking_state(prompt_ids, begin_id, end_id), then each round's result.state)"
        )
    if validate:
        check_distribution("p", p)
        check_distribution("q", q)
    if uniforms is None:
        uniforms = draw_uniforms((b, n + 1), generator)
    elif tuple(uniforms.shape) != (b, n + 1) or bool(((uniforms < 0) | (uniforms >= 1)).any()):
        raise ValueError(f"uniforms must be [B, N+1] = [{b}, {n + 1}] with values in [0, 1)")

    x = draft_ids.long()
    zp_d = None if z_p is None else z_p[:, :n]
    zq_d = None if z_q is None else z_q[:, :n]
    rej_x = spec.rej_at(Rows(p[:, :n], q[:, :n], x, zp_d, zq_d, temperature), knob)
    q_x = q[:, :n].gather(-1, x.unsqueeze(-1)).squeeze(-1)
    ratio = torch.where(q_x > 0, rej_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny), torch.zeros_like(rej_x))
    verdict = uniforms[:, :n] < ratio  # per-position native test, [B, N]
    if hook is not None:
        verdict = hook.accept(RoundContext(p, q, x, uniforms, verdict, named, z_p, z_q, temperature, state))
    outside = None  # [B, N+1] bool: positions verified strictly (scope "thinking", outside the segment)
    if scoped and not (hook is not None and hook.thinking_scoped) and not spec.is_strict(knob):
        outside = ~inside_thinking(state, x)
        if bool(outside.any()):  # strict's test there: the ratio as strict's rej_at gives it
            p_x = p[:, :n].gather(-1, x.unsqueeze(-1)).squeeze(-1)
            strict_ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny), torch.zeros_like(p_x))
            verdict = torch.where(outside[:, :n], uniforms[:, :n] < strict_ratio, verdict)
        else:
            outside = None
    accepted = verdict.long().cumprod(-1).sum(-1)  # leading accepts, [B]

    last = torch.empty(b, dtype=torch.long)
    rej = (accepted < n).nonzero().squeeze(-1)
    if rej.numel():  # residual norm((pi_res - q)+) at the first rejected position
        pos = accepted[rej]
        q_r = _take(q, rej, pos)
        r = Rows(_take(p, rej, pos), q_r, x[rej, pos], _take(z_p, rej, pos), _take(z_q, rej, pos), temperature)
        pi_res = spec.targets(r, knob).pi_res
        if outside is not None:  # strict's residual norm((p - q)+) outside thinking
            pi_res = torch.where(outside[rej, pos].unsqueeze(-1), r.p, pi_res)
        resid = (pi_res - q_r).clamp_min_(0.0)
        mass = resid.sum(-1)
        finite = torch.isfinite(mass)  # a NaN or inf anywhere in a row makes its mass non-finite
        if not bool(finite.all()):
            _refuse(spec, "residual", rej[~finite], pos[~finite])
        empty = mass <= 8 * torch.finfo(resid.dtype).eps
        if empty.any():  # the test could not have rejected (float error): sample pi_res
            resid[empty] = pi_res[empty]
        last[rej] = sample_from_rows(resid, uniforms[rej, n])
    bon = (accepted == n).nonzero().squeeze(-1)
    if bon.numel():  # bonus token at position N+1
        p_b = _take(p, bon, n)
        if spec.bonus_from_pi and not spec.is_strict(knob):
            r = Rows(p_b, _take(q, bon, n), None, _take(z_p, bon, n), _take(z_q, bon, n), temperature)
            pi_b = spec.targets(r, knob).pi_res
            p_b = pi_b if outside is None else torch.where(outside[bon, n].unsqueeze(-1), p_b, pi_b)
        last[bon] = sample_from_rows(p_b, uniforms[bon, n])
        # a valid row never yields a token of zero weight; a NaN row yields NaN (or 0)
        w = p_b.gather(-1, last[bon].unsqueeze(-1)).squeeze(-1)
        bad = ~(torch.isfinite(w) & (w > 0))
        if bad.any():
            _refuse(spec, "bonus", bon[bad], torch.full((int(bad.sum()),), n))

    steps = torch.arange(n + 1)
    tokens = torch.full((b, n + 1), -1, dtype=torch.long)
    tokens[:, :n] = torch.where(steps[:n] < accepted.unsqueeze(-1), x, tokens[:, :n])
    tokens[torch.arange(b), accepted] = last
    if hook is not None and hook.advance is not None:
        state = hook.advance(state, tokens, accepted + 1, named)
    elif scoped:
        state = advance_thinking(state, tokens, accepted + 1)
    return BatchRoundResult(tokens, accepted + 1, accepted, state)


def verify_round(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_ids: torch.Tensor,
    method: str | MethodSpec,
    knob: float | None = None,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
    z_p: torch.Tensor | None = None,
    z_q: torch.Tensor | None = None,
    temperature: float | None = None,
    validate: bool = True,
    state: Any = None,
    scope: str = "all",
) -> RoundResult:
    """One verification round for one sequence.

    Args:
        p: ``[N+1, V]`` verifier rows; q: ``[N, V]`` or ``[N+1, V]`` drafter rows;
        draft_ids: ``[N]``; uniforms: ``[N+1]``; z_p, z_q: ``[N+1, V]`` raw logits.
        The rest as in ``verify_rounds``.

    Returns:
        ``RoundResult``: emitted token ids and the number of accepted drafts.

    Raises:
        ValueError: as ``verify_rounds``.
    """
    if p.dim() != 2 or q.dim() != 2 or draft_ids.dim() != 1:
        raise ValueError(
            f"verify_round takes p [N+1, V], q [N(+1), V], draft_ids [N]; got {tuple(p.shape)}, "
            f"{tuple(q.shape)}, {tuple(draft_ids.shape)} (use verify_rounds for batches)"
        )

    def one(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.unsqueeze(0)

    out = verify_rounds(
        p.unsqueeze(0),
        q.unsqueeze(0),
        draft_ids.unsqueeze(0),
        method,
        knob,
        generator,
        uniforms=one(uniforms),
        z_p=one(z_p),
        z_q=one(z_q),
        temperature=temperature,
        validate=validate,
        state=state,
        scope=scope,
    )
    row = out.row(0)
    return row if out.state is None else RoundResult(row.tokens, row.accepted, out.state)
