"""A job's forward costs: a fixed ``c_rel``, or the serving profile (a cost profile per
serving batch size, ``relaxtune.decoding.serving.ServingProfile``) measured once per
output folder and saved beside the task's records, checked batch size by batch size
against each later measurement so that every trial of a study is priced alike; and how
every in-process backend measures it (``measure_profile``: the backends supply the
batched forwards)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ..decoding.serving import ServingProfile
from ..decoding.speed import (
    COST_MARGIN,
    MAX_PASSES,
    MIN_PASSES,
    CostProfile,
    measure_interleaved,
    noisy_flags,
)

__all__ = ["CostsError", "job_costs", "measure_profile", "check_batch_sizes", "JOB_MIN_PASSES", "JOB_MAX_PASSES"]

DEFAULT_C_REL = 0.2  # what a backend that cannot measure its costs is priced with
# the job's passes: every shape of every batch size runs once per pass (batch 16 verifying 21 tokens a row is
# 336 tokens a forward), so the job takes fewer than a one-batch-size profile's MIN_PASSES..MAX_PASSES
JOB_MIN_PASSES, JOB_MAX_PASSES = 3, 10


class CostsError(ValueError):
    """An export has no saved profile to price with (the message says what to do)."""


def check_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    """The serving batch sizes, increasing and without repeats.

    Raises:
        ValueError: none, or one that is not an integer >= 1.
    """
    sizes = sorted({int(b) for b in batch_sizes}) if batch_sizes else []
    if not sizes or sizes[0] < 1 or any(int(b) != b for b in batch_sizes):
        raise ValueError(f"serving batch sizes must be integers >= 1, got {list(batch_sizes)}")
    return sizes


def measure_profile(
    job: Callable[[str, int, int], Callable[[], None]],
    n_drafts: Sequence[int],
    batch_sizes: Sequence[int],
    has_drafter: bool,
    source: str,
    min_passes: int = MIN_PASSES,
    max_passes: int = MAX_PASSES,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> ServingProfile:
    """A backend's forward costs at each serving batch size B: verifier forwards over B
    rows of 1 and of N + 1 tokens for each N, drafter forwards over B rows of 1 token,
    every shape of every batch size timed in ONE interleaved measurement
    (``relaxtune.decoding.speed.measure_interleaved``), so a disturbance from other work
    hits all batch sizes alike, until their spread is small. Each cost is the fastest
    pass, and a pass over N + 1 tokens is never priced below one step at its batch size
    (a slow single-step sample would otherwise inflate every modeled speed-up). A
    batch size whose shapes' spread is still above ``SPREAD_TOLERANCE`` after
    ``max_passes`` has it written into its profile's ``flags``.

    Args:
        job: ``job(model, k, batch_size)`` returns a call that runs one forward of
            ``model`` ("verify" or "draft") over ``batch_size`` rows of ``k`` tokens,
            each row after the prompt plus 64 tokens in its cache, and rolls the cache
            back (the backend's own forwards).
        n_drafts: the draft lengths N to price.
        batch_sizes: the serving batch sizes B (``check_batch_sizes``).
        has_drafter: whether there is a drafter model (else ``t_draft = t_ar``).
        source: what measured (``<name> on <cpu>, <threads> threads``); the batch
            size and date are appended.
        clock: seconds (``time.perf_counter``; tests pass a scripted clock).

    Returns:
        ``ServingProfile``: one ``CostProfile`` (seconds per batched step) per batch
        size, ``batch_size`` set, weighted at the smallest.

    Raises:
        ValueError: bad batch sizes or pass bounds.
    """
    sizes = check_batch_sizes(batch_sizes)
    shapes = {"t_ar": ("verify", 1)} | ({"t_draft": ("draft", 1)} if has_drafter else {})
    shapes |= {f"t_verify[{k}]": ("verify", k) for k in sorted({n + 1 for n in n_drafts} - {1})}
    fastest, spread, passes = measure_interleaved(
        {(b, label): job(model, k, b) for b in sizes for label, (model, k) in shapes.items()},
        min_passes=min_passes,
        max_passes=max_passes,
        clock=clock,
    )
    date = time.strftime("%Y-%m-%d")
    profiles = {}
    for b in sizes:
        mine = {label: spread[(b, label)] for label in shapes}
        flags = noisy_flags(
            mine, passes, "; other work was running: re-measure on an idle machine (--remeasure-costs) or give --c-rel"
        )
        t_ar = fastest[(b, "t_ar")]
        profiles[b] = CostProfile(
            t_ar=t_ar,
            t_draft=fastest.get((b, "t_draft"), t_ar),
            t_verify={
                k: max(fastest[(b, label)], t_ar) for label, (_, k) in shapes.items() if label.startswith("t_verify")
            },
            source=f"{source}, batch {b}, measured {date}",
            spread=mine,
            passes=passes,
            flags=flags,
            batch_size=b,
        )
    return ServingProfile(profiles)


def job_costs(
    backend,
    prompt_ids: Callable[[], list[int]],
    n_drafts: list[int],
    saved: Path,
    *,
    batch_sizes: Sequence[int] = (1,),
    c_rel: float | str = "measured",
    remeasure: bool = False,
    new_trials: bool = True,
    log: Callable[[str], None] = print,
    on_measured: Callable[[ServingProfile], None] | None = None,
) -> ServingProfile | float:
    """The job's costs.

    - ``c_rel`` when it is a number (a fixed value overrides any measurement);
    - else the serving profile saved at ``saved`` (measured once per output folder, so
      every trial is priced alike; a file holding a single profile, saved before
      batch sizes, reads as batch size 1). A tuning run measures the costs again on
      ``prompt_ids()`` at ``batch_sizes`` (``backend.cost_profile``) and compares each
      batch size the saved profile holds: when a cost ratio the model reads differs from
      the saved one by more than ``COST_MARGIN``, the saved profile is still used but
      that batch size's profile carries a flag saying so (``remeasure`` adopts the new
      measurement, a fixed ``c_rel`` fixes a value). A new draft length extends the
      saved profile, its verify cost scaled by the two measurements' t_AR; a new batch
      size is added, scaled by the two measurements' t_AR at the smallest batch size
      both hold; a noisy new measurement flags that batch size's saved profile as
      unconfirmed;
    - ``remeasure`` (or no saved profile): the new measurement, saved;
    - c_rel = 0.2 for backends that cannot measure.

    A measurement whose spread stays above ``SPREAD_TOLERANCE`` is flagged too. The
    profile returned holds ``batch_sizes`` (those of them the saved profile has, for an
    export), weighted at the smallest (the job reweights it,
    ``ServingProfile.reweighted``). An export (``new_trials=False``) never measures: it
    prices with the saved profile. ``on_measured`` receives this run's own
    measurement, whichever profile prices (the job's time estimate reads the speed
    now from it).

    Raises:
        CostsError: an export without a saved profile (and without a fixed ``c_rel``).
        ValueError: bad ``batch_sizes``, or ones the backend cannot run (its message).
    """
    if c_rel != "measured":
        return float(c_rel)
    sizes = check_batch_sizes(batch_sizes)
    earlier = ServingProfile.from_dict(json.loads(saved.read_text())) if saved.exists() else None
    if not new_trials:
        if earlier is None and hasattr(backend, "cost_profile"):
            raise CostsError(
                f"no saved cost profile at {saved}: an export prices with the tuning run's costs; give "
                "its --c-rel or run `relaxtune tune`"
            )
        return _only(earlier, sizes) if earlier is not None else DEFAULT_C_REL
    if not hasattr(backend, "cost_profile"):
        log(
            f"this backend cannot measure its costs: using c_rel = {DEFAULT_C_REL} (give the measured value with "
            "--c-rel)"
        )
        return DEFAULT_C_REL
    log(
        f"measuring forward costs at serving batch size{'s' if len(sizes) > 1 else ''} "
        f"{', '.join(map(str, sizes))} (interleaved passes until their spread is small)"
    )
    fresh = backend.cost_profile(
        prompt_ids(), sorted(n_drafts), sizes, min_passes=JOB_MIN_PASSES, max_passes=JOB_MAX_PASSES
    )
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
    return _only(_against_saved(earlier, fresh, n_drafts, saved, log), sizes)


def _only(profile: ServingProfile, sizes: list[int]) -> ServingProfile:
    """``profile`` at the batch sizes of ``sizes`` it holds (all of it when it holds none of them)."""
    kept = {b: p for b, p in profile.profiles.items() if b in sizes} or dict(profile.profiles)
    return ServingProfile(kept)


def _against_saved(
    earlier: ServingProfile, fresh: ServingProfile, n_drafts: list[int], saved: Path, log: Callable[[str], None]
) -> ServingProfile:
    """The saved profile, extended to new draft lengths and new batch sizes (saved so),
    each batch size flagged when this run's measurement ``fresh`` differs from it by more
    than ``COST_MARGIN`` there, or was disturbed."""
    profiles = dict(earlier.profiles)
    changed = []
    shared = sorted(profiles.keys() & fresh.profiles.keys())
    for b in shared:
        mine, now = profiles[b], fresh.profiles[b]
        new_k = {n + 1 for n in n_drafts} - set(mine.t_verify)
        if new_k:  # price new draft lengths on the saved scale: the ratio to t_AR is what was measured now
            added = {k: max(now.t_verify[k] * mine.t_ar / now.t_ar, mine.t_ar) for k in new_k}
            profiles[b] = replace(
                mine,
                t_verify={**mine.t_verify, **added},
                spread=mine.spread
                | {f"t_verify[{k}]": now.spread[f"t_verify[{k}]"] for k in new_k if f"t_verify[{k}]" in now.spread},
            )
            changed.append(f"verify(N+1) for N = {', '.join(str(k - 1) for k in sorted(new_k))} at batch {b}")
    new_b = sorted(fresh.profiles.keys() - profiles.keys())
    if new_b:  # on the saved scale too: the ratios between batch sizes are what was measured now
        scale = profiles[shared[0]].t_ar / fresh.profiles[shared[0]].t_ar if shared else 1.0
        for b in new_b:
            now = fresh.profiles[b]
            profiles[b] = replace(
                now,
                t_ar=now.t_ar * scale,
                t_draft=now.t_draft * scale,
                t_verify={k: t * scale for k, t in now.t_verify.items()},
                flags=[],
            )
        changed.append(f"batch size{'s' if len(new_b) > 1 else ''} {', '.join(map(str, new_b))}")
    if changed:
        _save(saved, ServingProfile(profiles))
        log(f"cost profile extended to {'; '.join(changed)} (saved to {saved})")
    for b in shared:
        mine, now = profiles[b], fresh.profiles[b]
        if now.flags:  # a disturbed check cannot tell whether the saved profile still holds
            flag = (
                f"this run's check of the saved profile was disturbed ({now.summary()}): the speed-ups are priced "
                "with the saved one, unconfirmed; run again on an idle machine, or give --c-rel"
            )
            log(f"warning: cost profile: batch {b}: {flag}")
            profiles[b] = replace(mine, flags=[*mine.flags, flag])
            continue
        gap, ratio = now.difference(mine)
        if gap > COST_MARGIN:
            flag = (
                f"this run measured {ratio} {gap:.0%} off the saved profile (margin {COST_MARGIN:.0%}; now "
                f"{now.summary()}): the speed-ups are priced with the saved one; --remeasure-costs adopts the new "
                "measurement (a new --output-dir keeps studies apart), --c-rel fixes a value"
            )
            log(f"warning: cost profile: batch {b}: {flag}")
            profiles[b] = replace(mine, flags=[*mine.flags, flag])
        else:
            log(f"cost profile at batch {b}: the saved one, within {gap:.0%} of this run's measurement ({saved})")
    return ServingProfile(profiles)


def _save(path: Path, profile: ServingProfile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=2))
