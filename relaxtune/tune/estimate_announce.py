"""A tuning job's estimate as the job announces it, and what the job keeps for the next one.

``announce`` gathers, before the first generation, what ``estimate_job``
(``relaxtune.tune.estimate``) needs from what is on disk (the saved cost profile, the
pair's records beside it, strict's samples already recorded, the earlier runs of the task
and pair kept in the cache: ``relaxtune.tune.estimate_history``) and from the backend (its
batch size and device), and prints the plan. After the job, ``keep_measures`` adds what it
measured to that history, unless the plan found the machine busy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile
from .estimate import estimate_job, figure_count, one_row
from .estimate_history import history_path, measure_run, recall, remember
from .estimate_plan import JobEstimate
from .progress import prior_length
from .setting_groups import SearchSettings, StatsSettings

__all__ = ["announce", "keep_measures"]


def announce(
    search: SearchSettings,
    stats: StatsSettings,
    output_dir: Path,
    batch_size: int | None,
    spec,
    problems: list,
    held_out: list,
    backend,
    profile,
    measured: ServingProfile | CostProfile | None,
    saved_path: Path,
    log: Callable[[str], None],
) -> JobEstimate:
    """``estimate_job`` for a job about to generate, from what is on disk (the saved
    profile at ``saved_path``, the pair's records beside it for the response length and
    strict's samples already recorded; earlier runs of the task and pair kept in the cache,
    ``relaxtune.tune.estimate_history``) and the backend (its batch size and device); each line of the plan goes
    to ``log``.

    Args:
        search / stats: the job's search and statistics settings.
        output_dir: the job's output folder (its records); batch_size: the job's
            ``--batch-size`` (None: the backend's own).
        problems / held_out: the search's problems and a confirmation's.
        measured: this run's cost measurement (None: nothing was measured).
    """
    from ..tasks.spec import build_prompt_ids
    from .phases import active
    from .point_records import DecodeConfig, finished_samples

    saved, now = None, one_row(measured)
    if saved_path.exists() and now is not None:
        try:
            saved = one_row(ServingProfile.from_dict(json.loads(saved_path.read_text())))
        except (ValueError, KeyError, TypeError):
            saved = None
        if saved is not None and math.isclose(saved.t_ar, now.t_ar) and math.isclose(saved.t_draft, now.t_draft):
            saved = None  # the profile was measured just now: nothing earlier to compare with
    device = getattr(backend, "device", "cpu")
    device = str(getattr(device, "type", device) or "cpu")
    if getattr(backend, "runtime", None) == "llamacpp":
        device = "llamacpp"  # its own batch exponent: a CPU bound by arithmetic
    batch = int(batch_size or getattr(backend, "batch_size", None) or getattr(backend, "max_concurrency", None) or 1)
    strict = DecodeConfig("strict", None, search.mid_n_draft, search.seed)
    done = finished_samples(Path(output_dir), spec, strict, getattr(backend, "name", "backend"), problems)
    kept = history_path(spec.name, spec.version, saved_path.parent.name)
    history = recall(kept)
    length = prior_length(saved_path.parent, spec.max_new_tokens)
    if history is not None and length[1].startswith("assumed"):
        length = None  # no record in this folder: the earlier runs' mean
    est = estimate_job(
        search,
        stats,
        spec,
        len(problems),
        len(held_out),
        profile,
        measured,
        saved,
        length=length,
        batch_size=batch,
        device=device,
        strict_done=done,
        prompt_tokens=_mean_prompt(backend, spec, problems, build_prompt_ids),
        elapsed=_elapsed(active()),
        figures=figure_count(list(search.methods)),
        history=history,
    )
    est.history_file = kept
    for line in est.lines():
        log(line)
    return est


def _mean_prompt(backend, spec, problems: list, build) -> float:
    """Mean prompt tokens of ``problems`` (0 when the backend has no tokenizer to count them)."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None or not problems:
        return 0.0
    try:
        return sum(len(build(tokenizer, spec, p)) for p in problems) / len(problems)
    except Exception:  # a tokenizer that cannot build prompts here: the estimate leaves prefill out
        return 0.0


def _elapsed(timer) -> float:
    """Wall seconds the job spent before its plan: since the active timer started, plus the
    imports it holds (the command's start); 0 without a timer."""
    if timer is None:
        return 0.0
    imports = timer.phases.get("imports")
    return timer.wall + (imports.wall if imports is not None else 0.0)


def keep_measures(estimate: JobEstimate | None, timer: dict) -> Path | None:
    """After a job: what it measured (``measure_run`` of its phase table ``timer``, at the
    t_AR it priced with) added to the history its plan read (``estimate.history_file``),
    for the next job's first estimate. A job whose plan found the machine busy
    (``JobEstimate.busy``) keeps nothing: its seconds a sample measure the other work too,
    and would mislead the next estimate (scaled by t_AR, a busy run's time is no run's).
    Returns the file written, or None."""
    if estimate is None or estimate.busy:
        return None
    return remember(estimate.history_file, measure_run(timer, estimate.t_ar))
