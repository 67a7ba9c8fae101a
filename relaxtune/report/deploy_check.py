"""Does the deployed rule reproduce what was measured? One point run twice on the
same weights, dtype, prompt ids, stop strings and sampling: through transformers'
own assisted generation (``model.generate(assistant_model=...,
assistant_ensemble_weight=w)``, the engine's code, not ours) and through
relaxtune's own loop (``relaxtune.engine.sequence.generate``, ``--runtime hf``),
then compared.

Compared (``compare``):
- per-round acceptance counts (accepted drafts, 0..N), over the rounds that draft N
  tokens, each response's last round left out (EOS, stop strings and the budget
  cut it: transformers drafts fewer tokens when ``cur_len + N + 1`` passes the
  budget, so those rounds are left out on both sides): chi-square test of
  homogeneity (Pearson, ``scipy.stats.chi2_contingency``) on the 2 x (N + 1) table,
  plus the mean's difference with a normal 95 % interval;
- response lengths (tokens): Welch's t-test, difference with its 95 % interval;
- accuracy, when graded: two-proportion z-test, difference with its 95 % interval.

Verdict: "agree" when no test rejects at ``alpha`` (default 0.01), else
"disagree". Each side needs ``min_rounds`` (default 500) compared rounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import stats as st

from ..decoding.sampling import SamplingParams
from ..engine.sequence import generate
from .deploy import assistant_config

__all__ = ["MIN_ROUNDS", "Comparison", "Side", "compare", "relaxtune_side", "transformers_side"]

MIN_ROUNDS = 500
_Z95 = 1.959963984540054


@dataclass
class Side:
    """One side's measurement: ``counts`` accepted drafts per compared round,
    ``lengths`` response tokens, ``correct`` graded verdicts (None: not graded),
    ``texts`` the responses."""

    label: str
    n_draft: int
    counts: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    correct: list[bool] | None = None
    texts: list[str] = field(default_factory=list)


def _keep(rounds: list[tuple[int, int, int]], n_draft: int, max_new_tokens: int) -> list[int]:
    """Accepted counts of the rounds compared: ``(tokens before the round, drafted,
    accepted)``, the last round left out, and rounds past ``max_new_tokens - N - 1``."""
    return [acc for pos, drafted, acc in rounds[:-1] if drafted == n_draft and pos + n_draft + 1 <= max_new_tokens]


class _Recorder:
    """Records ``(tokens before the round, N, accepted drafts)`` per round of a batch of
    one while installed on a backend (``with _Recorder(backend) as rec``: its
    ``draft_batch`` and ``commit_batch`` wrapped on the instance, removed on exit):
    accepted = the committed tokens' leading matches with the drafts (the token after
    them is the residual or bonus, never the rejected draft)."""

    def __init__(self, backend) -> None:
        self._backend, self.rounds, self._drafted, self._pos = backend, [], None, 0

    def __enter__(self) -> _Recorder:
        draft_batch, commit_batch = self._backend.draft_batch, self._backend.commit_batch

        def draft(batch, n: int, pick, extra_step: bool = False):
            ids, z_q = draft_batch(batch, n, pick, extra_step=extra_step)
            self._drafted = [int(t) for t in ids[0, :n]]
            return ids, z_q

        def commit(batch, tokens):
            kept = list(tokens[0])
            if self._drafted is not None:
                ids = self._drafted
                acc = next((i for i, (a, b) in enumerate(zip(kept, ids)) if a != b), min(len(kept), len(ids)))
                self.rounds.append((self._pos, len(ids), acc))
                self._drafted = None
            self._pos += len(kept)
            return commit_batch(batch, tokens)

        self._backend.draft_batch, self._backend.commit_batch = draft, commit
        return self

    def __exit__(self, *exc) -> None:
        del self._backend.draft_batch, self._backend.commit_batch


def relaxtune_side(
    backend,
    prompts: Sequence[list[int]],
    *,
    method: str,
    knob: Any,
    n_draft: int,
    sampling: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    seed: int = 0,
    label: str = "relaxtune",
    log: Callable[[str], None] = lambda line: None,
) -> Side:
    """The point through relaxtune's own loop, one response per prompt (seeds
    ``seed + i``); ``log`` gets a progress line after each response (``_progress``).

    Raises:
        ValueError: as ``relaxtune.engine.sequence.generate``.
    """
    side = Side(label, n_draft)
    for i, ids in enumerate(prompts):
        with _Recorder(backend) as rec:
            gen = generate(
                backend,
                ids,
                method=method,
                knob=knob,
                n_draft=n_draft,
                sampling=sampling,
                max_new_tokens=max_new_tokens,
                seed=seed + i,
                stop=stop,
            )
        side.counts += _keep(rec.rounds, n_draft, max_new_tokens)
        side.lengths.append(gen.stats.response_tokens)
        side.texts.append(gen.text)
        log(_progress(side, len(prompts)))
    return side


def transformers_side(
    drafter,
    verifier,
    prompts: Sequence[list[int]],
    *,
    weight: float | None,
    n_draft: int,
    sampling: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    tokenizer=None,
    eos: Sequence[int] = (),
    seed: int = 0,
    label: str = "transformers",
    log: Callable[[str], None] = lambda line: None,
) -> Side:
    """The point through transformers' assisted generation: ``verifier.generate(
    assistant_model=drafter, assistant_ensemble_weight=weight, do_sample=...)`` with
    the assistant's generation config pinned (``relaxtune.report.deploy.assistant_config``,
    and its EOS to ``eos``),
    the sampling transform given explicitly (no repetition penalty), ``stop_strings``
    with ``tokenizer`` when ``stop`` is given. Per-round counts come from
    ``relaxtune.backends.transformers_compat.record_assisted_rounds``.

    Args:
        drafter, verifier: the transformers models; weight: ``assistant_ensemble_weight``
            (None: lossless); eos: end-of-sequence ids (empty: none).
        log: a progress line after each response (``_progress``).
    """
    from ..backends.transformers_compat import pinned_generation_config, record_assisted_rounds

    greedy = not sampling.temperature
    kw: dict[str, Any] = dict(
        do_sample=not greedy,
        max_new_tokens=max_new_tokens,
        repetition_penalty=1.0,
        eos_token_id=list(eos) or None,
        pad_token_id=(list(eos) or [0])[0],
    )
    if not greedy:
        kw.update(
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.top_p is not None else 1.0,
            top_k=sampling.top_k or 0,
        )
    if weight is not None:
        kw["assistant_ensemble_weight"] = weight
    if stop:
        kw.update(stop_strings=list(stop), tokenizer=tokenizer)
    side = Side(label, n_draft)
    device = next(verifier.parameters()).device
    # the assistant's own EOS too: its generate() fills an unset eos_token_id from its generation config
    with pinned_generation_config(drafter, assistant_config(n_draft) | {"eos_token_id": list(eos) or None}):
        for i, ids in enumerate(prompts):
            torch.manual_seed(seed + i)
            x = torch.tensor([list(ids)], device=device)
            with record_assisted_rounds() as rounds:
                out = verifier.generate(x, attention_mask=torch.ones_like(x), assistant_model=drafter, **kw)
            new = out[0, x.shape[1] :].tolist()
            pos, kept = 0, []
            for drafted, acc in rounds:  # tokens before each round: the previous rounds' accepted + 1
                kept.append((pos, drafted, acc))
                pos += acc + 1
            side.counts += _keep(kept, n_draft, max_new_tokens)
            side.lengths.append(len(new))
            side.texts.append(tokenizer.decode(new) if tokenizer is not None else "")
            log(_progress(side, len(prompts)))
    return side


def _progress(side: Side, total: int) -> str:
    """``"relaxtune: 3/16 responses, 212 rounds compared so far"``."""
    return f"{side.label}: {len(side.lengths)}/{total} responses, {len(side.counts)} rounds compared so far"


@dataclass(frozen=True)
class Comparison:
    """``tests``: name -> ``{difference, low, high, p}`` (a relaxtune side minus
    transformers side, 95 % intervals; acceptance also ``chi2``, ``histograms``);
    ``verdict``: "agree" / "disagree" at ``alpha``."""

    a: str
    b: str
    rounds: tuple[int, int]
    tests: dict
    alpha: float
    verdict: str

    def lines(self) -> list[str]:
        """Human-readable report, the verdict last."""
        out = [f"{self.a} vs {self.b}: {self.rounds[0]} and {self.rounds[1]} compared rounds"]
        for name, t in self.tests.items():
            out.append(
                f"  {name}: {self.a} - {self.b} = {t['difference']:+.4f} (95% [{t['low']:+.4f}, "
                f"{t['high']:+.4f}]), p = {t['p']:.3g}" + (f", chi2 {t['chi2']:.2f}" if "chi2" in t else "")
            )
            if "histograms" in t:
                out.append(f"    accepted 0..N: {t['histograms'][0]} vs {t['histograms'][1]}")
        out.append(f"verdict: {self.verdict} (alpha {self.alpha:g})")
        return out


def _diff(x: np.ndarray, y: np.ndarray) -> dict:
    d = float(x.mean() - y.mean())
    se = math.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y)) if len(x) > 1 and len(y) > 1 else math.inf
    return {"difference": d, "low": d - _Z95 * se, "high": d + _Z95 * se}


def compare(a: Side, b: Side, alpha: float = 0.01, min_rounds: int = MIN_ROUNDS) -> Comparison:
    """Compare two sides (module doc).

    Raises:
        ValueError: a side with fewer than ``min_rounds`` compared rounds.
    """
    for s in (a, b):
        if len(s.counts) < min_rounds:
            raise ValueError(
                f"{s.label}: {len(s.counts)} compared rounds, need at least {min_rounds}: "
                "more prompts or a larger --max-new-tokens"
            )
    width = max(a.n_draft, b.n_draft) + 1
    table = np.array([np.bincount(s.counts, minlength=width) for s in (a, b)])
    table_nz = table[:, table.sum(0) > 0]
    if table_nz.shape[1] > 1:
        chi2, p_acc, _, _ = st.chi2_contingency(table_nz, correction=False)
    else:
        chi2, p_acc = 0.0, 1.0
    ca, cb = np.asarray(a.counts, float), np.asarray(b.counts, float)
    tests = {
        "acceptance per round": _diff(ca, cb)
        | {"p": float(p_acc), "chi2": float(chi2), "histograms": [table[0].tolist(), table[1].tolist()]}
    }
    la, lb = np.asarray(a.lengths, float), np.asarray(b.lengths, float)
    same = la.var() == 0 and lb.var() == 0
    p_len = (1.0 if la.mean() == lb.mean() else 0.0) if same else float(st.ttest_ind(la, lb, equal_var=False).pvalue)
    tests["response length"] = _diff(la, lb) | {"p": p_len}
    if a.correct is not None and b.correct is not None:
        xa, xb = np.asarray(a.correct, float), np.asarray(b.correct, float)
        pooled = (xa.sum() + xb.sum()) / (len(xa) + len(xb))
        se0 = math.sqrt(pooled * (1 - pooled) * (1 / len(xa) + 1 / len(xb)))
        d = xa.mean() - xb.mean()
        p_accu = 1.0 if se0 == 0 else float(2 * st.norm.sf(abs(d) / se0))
        tests["accuracy"] = _diff(xa, xb) | {"p": p_accu}
    verdict = "agree" if all(t["p"] >= alpha for t in tests.values()) else "disagree"
    return Comparison(a.label, b.label, (len(a.counts), len(b.counts)), tests, alpha, verdict)
