"""A job's forward costs: a fixed ``c_rel``, or the cost profile measured once per
output folder and saved beside the task's records, checked against each later
measurement so that every trial of a study is priced alike; and how every in-process
backend measures its profile (``measure_profile``: the backends supply the forwards)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ..decoding.speed import COST_MARGIN, MAX_PASSES, MIN_PASSES, SPREAD_TOLERANCE, CostProfile, measure_interleaved

__all__ = ["CostsError", "job_costs", "measure_profile"]

DEFAULT_C_REL = 0.2  # what a backend that cannot measure its costs is priced with


class CostsError(ValueError):
    """An export has no saved profile to price with (the message says what to do)."""


def measure_profile(
    job: Callable[[str, int], Callable[[], None]],
    n_drafts: Sequence[int],
    has_drafter: bool,
    source: str,
    min_passes: int = MIN_PASSES,
    max_passes: int = MAX_PASSES,
) -> CostProfile:
    """A backend's forward costs, one sequence at a time: verifier forwards over 1 and
    N + 1 tokens for each N, drafter forwards over 1 token, timed in interleaved passes
    until their spread is small (``relaxtune.decoding.speed.measure_interleaved``).
    Each cost is the fastest pass, and a pass over N + 1 tokens is never priced below
    one step (a slow single-step sample would otherwise inflate every modeled
    speed-up). A spread still above ``SPREAD_TOLERANCE`` after ``max_passes`` is
    written into the profile's ``flags``.

    Args:
        job: ``job(model, k)`` returns a call that runs one forward of ``model``
            ("verify" or "draft") over ``k`` tokens after the prompt plus 64 tokens
            in its cache, and rolls the cache back (the backend's own forwards).
        n_drafts: the draft lengths N to price.
        has_drafter: whether there is a drafter model (else ``t_draft = t_ar``).
        source: what measured (``<name> on <cpu>, <threads> threads``); the batch and
            date are appended.

    Returns:
        ``CostProfile`` (seconds), with its spreads.
    """
    shapes = {"t_ar": ("verify", 1)} | ({"t_draft": ("draft", 1)} if has_drafter else {})
    shapes |= {f"t_verify[{k}]": ("verify", k) for k in sorted({n + 1 for n in n_drafts} - {1})}
    fastest, spread, passes = measure_interleaved(
        {label: job(*shape) for label, shape in shapes.items()}, min_passes=min_passes, max_passes=max_passes
    )
    t_ar = fastest["t_ar"]
    noisy = {k: v for k, v in spread.items() if v > SPREAD_TOLERANCE}
    flags = (
        [
            f"noisy measurement: spread {', '.join(f'{k} {v:.0%}' for k, v in noisy.items())} after {passes} "
            f"interleaved passes (tolerance {SPREAD_TOLERANCE:.0%}); other work was running: re-measure on an "
            "idle machine (--remeasure-costs) or give --c-rel"
        ]
        if noisy
        else []
    )
    return CostProfile(
        t_ar=t_ar,
        t_draft=fastest.get("t_draft", t_ar),
        t_verify={k: max(fastest[label], t_ar) for label, (_, k) in shapes.items() if label.startswith("t_verify")},
        source=f"{source}, batch 1, measured {time.strftime('%Y-%m-%d')}",
        spread=spread,
        passes=passes,
        flags=flags,
    )


def job_costs(
    backend,
    prompt_ids: Callable[[], list[int]],
    n_drafts: list[int],
    saved: Path,
    *,
    c_rel: float | str = "measured",
    remeasure: bool = False,
    new_trials: bool = True,
    log: Callable[[str], None] = print,
    on_measured: Callable[[CostProfile], None] | None = None,
) -> CostProfile | float:
    """The job's costs.

    - ``c_rel`` when it is a number (a fixed value overrides any measurement);
    - else the profile saved at ``saved`` (measured once per output folder, so every
      trial is priced alike). A tuning run measures the costs again on
      ``prompt_ids()`` and compares: when a cost ratio the model reads differs from
      the saved one by more than ``COST_MARGIN``, the saved profile is still used but
      carries a flag saying so (``remeasure`` adopts the new measurement, a fixed
      ``c_rel`` fixes a value). A new draft length extends the saved profile, its
      verify cost scaled by the two measurements' t_AR; a noisy new measurement
      flags the saved profile as unconfirmed;
    - ``remeasure`` (or no saved profile): the new measurement, saved;
    - c_rel = 0.2 for backends that cannot measure (SGLang).

    A measurement whose spread stays above ``SPREAD_TOLERANCE`` is flagged too.
    An export (``new_trials=False``) never measures: it prices with the saved profile.
    ``on_measured`` receives this run's own measurement, whichever profile prices
    (the job's time estimate reads the speed now from it).

    Raises:
        CostsError: an export without a saved profile (and without a fixed ``c_rel``).
    """
    if c_rel != "measured":
        return float(c_rel)
    earlier = CostProfile.from_dict(json.loads(saved.read_text())) if saved.exists() else None
    if not new_trials:
        if earlier is None and hasattr(backend, "cost_profile"):
            raise CostsError(
                f"no saved cost profile at {saved}: an export prices with the tuning run's costs; give "
                "its --c-rel or run `relaxtune tune`"
            )
        return earlier if earlier is not None else DEFAULT_C_REL
    if not hasattr(backend, "cost_profile"):
        log(
            f"this backend cannot measure its costs: using c_rel = {DEFAULT_C_REL} (give the measured value with "
            "--c-rel)"
        )
        return DEFAULT_C_REL
    log("measuring forward costs (interleaved passes until their spread is small)")
    fresh = backend.cost_profile(prompt_ids(), sorted(n_drafts))
    if on_measured is not None:
        on_measured(fresh)
    for flag in fresh.flags:
        log(f"warning: cost profile: {flag}")
    if earlier is not None and remeasure:
        log(
            f"--remeasure-costs: replacing the saved profile ({earlier.summary()}); trials already in the studies "
            "keep the speed-ups they were priced with"
        )
    if earlier is None or remeasure:
        _save(saved, fresh)
        log(f"measured cost profile: {fresh.summary()} (saved to {saved})")
        return fresh
    return _against_saved(earlier, fresh, n_drafts, saved, log)


def _against_saved(
    earlier: CostProfile, fresh: CostProfile, n_drafts: list[int], saved: Path, log: Callable[[str], None]
) -> CostProfile:
    """The saved profile (extended to new draft lengths), flagged when this
    run's measurement ``fresh`` differs from it by more than ``COST_MARGIN``."""
    new_k = {n + 1 for n in n_drafts} - set(earlier.t_verify)
    if new_k:  # price new draft lengths on the saved scale: the ratio to t_AR is what was measured now
        added = {k: max(fresh.t_verify[k] * earlier.t_ar / fresh.t_ar, earlier.t_ar) for k in new_k}
        earlier = replace(
            earlier,
            t_verify={**earlier.t_verify, **added},
            spread=earlier.spread
            | {f"t_verify[{k}]": fresh.spread[f"t_verify[{k}]"] for k in new_k if f"t_verify[{k}]" in fresh.spread},
        )
        _save(saved, earlier)
        log(
            f"cost profile extended to verify(N+1) for N = {', '.join(str(k - 1) for k in sorted(new_k))} "
            f"(saved to {saved})"
        )
    if fresh.flags:  # a disturbed check cannot tell whether the saved profile still holds
        flag = (
            f"this run's check of the saved profile was disturbed ({fresh.summary()}): the speed-ups are priced "
            "with the saved one, unconfirmed; run again on an idle machine, or give --c-rel"
        )
        log(f"warning: cost profile: {flag}")
        return replace(earlier, flags=[*earlier.flags, flag])
    gap, ratio = fresh.difference(earlier)
    if gap > COST_MARGIN:
        flag = (
            f"this run measured {ratio} {gap:.0%} off the saved profile (margin {COST_MARGIN:.0%}; now "
            f"{fresh.summary()}): the speed-ups are priced with the saved one; --remeasure-costs adopts the new "
            "measurement (a new --output-dir keeps studies apart), --c-rel fixes a value"
        )
        log(f"warning: cost profile: {flag}")
        return replace(earlier, flags=[*earlier.flags, flag])
    log(f"cost profile: the saved one ({earlier.summary()}), within {gap:.0%} of this run's measurement ({saved})")
    return earlier


def _save(path: Path, profile: CostProfile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=2))
