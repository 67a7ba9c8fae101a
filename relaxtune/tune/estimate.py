"""A tuning job's plan and how long it should take, priced before the first generation.

The plan (``JobEstimate``, ``relaxtune.tune.estimate_plan``) counts samples and
response tokens per phase: strict at each draft length the search will use, every
method's trials (each in stages of ``stage_size`` problems; pruning can stop it after
the first), and the confirmations (only when a point is chosen). The wall time prices
those tokens with the forward costs just measured (``relaxtune.decoding.speed.CostProfile``,
one sequence at a time: a serving profile's smallest batch size, ``one_row``):

    seconds(phase) = tokens * round_seconds(N) / (l_accept + 1) / batch_gain(B)

where ``round_seconds(N) = N t_draft + t_verify(N+1)`` (the paper's round, section 3;
``relaxtune.decoding.speed``), ``l_accept`` the accepted drafts per round, and
``batch_gain(B) = B ** BATCH_EXPONENT`` the aggregate throughput of B rows over one
row. Before any sample exists two figures are priors, said in the plan:
``ACCEPT_PRIOR`` (l_accept = 0.6 N) and the response length (the mean of the pair's
records of this task when there are any, else ``LENGTH_PRIOR`` of the task's token
budget). ``BATCH_EXPONENT`` on a CPU comes from the README's batch table (strict at
batch 8: 3.95x batch 1, 8 ** 0.66 = 3.95); on a GPU rows are nearly free (0.9);
llama.cpp on a CPU is bound by arithmetic even at batch 1 (README, the llama.cpp
backend: its own AR at batch 16 is 1.47x batch 1, relaxtune strict 1.2x), so 0.1.

With a ``ServingProfile`` (cost profiles at several batch sizes,
``relaxtune.decoding.serving``), ``R`` rows are priced with the profile at the
largest measured batch size ``b <= R``: a row-round costs ``round_seconds_b(N) / b``,
and the rows beyond ``b`` gain ``(R / b) ** BATCH_EXPONENT`` more.

Every evaluation prefills its prompts in both models: ``prompt tokens x
prefill_seconds``, one prompt token priced as a token of the verify pass of the
largest N (``t_verify(N+1) / (N+1)``, the CPU bound by arithmetic) plus the
drafter's share of it (``t_draft / t_AR`` of that).

The whole job's wall time (``JobEstimate.job_seconds``) adds what was spent before
the plan (imports, model load, the cost profiles at every batch size: measured,
``relaxtune.tune.phases``) and the finish: MLflow's runs (``MLFLOW_SECONDS``) and
the figures (``FIGURE_SECONDS`` each; ``figure_count``), priors for a 2-core CPU.

The machine looks busy when this run's single-step cost ``t_AR`` is more than
``BUSY_FACTOR`` times the saved profile's, or when the 1-minute load average exceeds
the cores this process may use; the plan then says by how much and what the job
would take at the saved (idle) speed.

The job gathers these figures from what is on disk and prints the plan with
``relaxtune.tune.estimate_announce``, which also keeps what the job measured for the
next estimate.
"""

from __future__ import annotations

import math
import os

from ..decoding.methods import get_method
from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile
from .estimate_history import History
from .estimate_plan import BUSY_FACTOR, JobEstimate, Phase
from .progress import LENGTH_PRIOR
from .setting_groups import SearchSettings, StatsSettings

__all__ = [
    "estimate_job",
    "machine_load",
    "ACCEPT_PRIOR",
    "BATCH_EXPONENT",
    "one_row",
    "FIGURE_SECONDS",
    "MLFLOW_SECONDS",
    "figure_count",
]

ACCEPT_PRIOR = 0.6  # accepted drafts per round / N, before strict has run
BATCH_EXPONENT = {"cpu": 0.66, "cuda": 0.9, "llamacpp": 0.1}  # throughput of B rows = B ** exponent x one row's
FIGURE_SECONDS = 1.5  # one figure drawn (matplotlib Agg, two panels) and saved to PNG on a 2-core CPU (prior)
MLFLOW_SECONDS = 4.0  # the finish's MLflow calls on a local SQLite store: runs closed, tables, config (prior)


def one_row(profile) -> CostProfile | None:
    """The one-sequence costs the estimate prices with: a serving profile's at its
    smallest batch size (batch 1 unless the job measured without it), a
    ``CostProfile`` itself, None for a fixed c_rel."""
    if isinstance(profile, ServingProfile):
        return profile.at(profile.batch_sizes[0])
    return profile if isinstance(profile, CostProfile) else None


def machine_load() -> tuple[float | None, int]:
    """``(1-minute load average or None where unknown, cores this process may use)``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    try:
        return os.getloadavg()[0], cores
    except OSError:
        return None, cores


def estimate_job(
    search: SearchSettings,
    stats: StatsSettings,
    spec,
    n_search: int,
    n_confirm: int,
    profile: ServingProfile | CostProfile | float,
    measured: ServingProfile | CostProfile | None = None,
    saved: ServingProfile | CostProfile | None = None,
    *,
    length: tuple[float, str] | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    strict_done: int = 0,
    load: tuple[float | None, int] | None = None,
    prompt_tokens: float = 0.0,
    elapsed: float = 0.0,
    figures: int = 0,
    history: History | None = None,
) -> JobEstimate:
    """The job's plan and expected wall time (see the module doc for the formula).

    Args:
        search: the job's search settings (methods, trials, n_drafts, stage_size).
        stats: its statistics settings (confirmations, confirm).
        spec: the task (repeats, max_new_tokens).
        n_search / n_confirm: problems the search and each confirmation run on.
        profile: what the job prices trials with; ``measured``: this run's own
            measurement (the speed now), priced with in preference; ``saved``: the
            profile saved earlier, to compare with.
        length: ``(expected tokens per response, where from)``; default ``LENGTH_PRIOR``.
        batch_size: rows decoded together; device: ``cpu``, ``cuda`` or ``llamacpp``
            (llama.cpp on a CPU), which sets the batch exponent (``BATCH_EXPONENT``).
        strict_done: strict samples at the middle N already recorded (a resumed job).
        load: ``(load average, cores)``; default ``machine_load()``.
        prompt_tokens: mean prompt tokens of a sample (prefilled in both models).
        elapsed: wall seconds the job spent before the plan.
        figures: figures the finish draws (``figure_count``).
        history: what earlier runs of this task and pair measured (``recall``): with it the
            length (when ``length`` is None), the acceptance, and on a host it ran on the
            seconds a sample (scaled by t_AR now over theirs) and the finish come from it.

    Returns:
        ``JobEstimate``; its ``seconds`` is None when there is no ``CostProfile``.

    Raises:
        ValueError: a negative count (problems, strict_done), batch_size below 1, or a
            response length that is not a finite number >= 0.
    """
    if min(n_search, n_confirm, strict_done) < 0 or batch_size < 1:
        raise ValueError(
            f"estimate_job: counts must be >= 0 and batch_size >= 1 (n_search {n_search}, n_confirm "
            f"{n_confirm}, strict_done {strict_done}, batch_size {batch_size})"
        )
    if not (math.isfinite(prompt_tokens) and prompt_tokens >= 0 and math.isfinite(elapsed) and elapsed >= 0):
        raise ValueError(
            f"estimate_job: prompt_tokens and elapsed must be finite numbers >= 0, got {prompt_tokens}, {elapsed}"
        )
    if length is not None and not (math.isfinite(length[0]) and length[0] >= 0):
        raise ValueError(f"estimate_job: the response length must be a finite number >= 0, got {length[0]}")
    repeats = spec.repeats
    strict_done = min(strict_done, n_search * repeats)  # more recorded than the search needs: nothing left to do
    speed = measured or (profile if isinstance(profile, (CostProfile, ServingProfile)) else None)
    if length is None and history is not None:
        length = (history.tokens_per_sample, "earlier runs' mean")
    length_tokens, length_from = length or (
        LENGTH_PRIOR * spec.max_new_tokens,
        f"assumed: {LENGTH_PRIOR:.0%} of the task's {spec.max_new_tokens}-token budget",
    )
    accept = history.accept if history is not None and history.accept is not None else ACCEPT_PRIOR
    timed = history.seconds_per_sample(None if speed is None else one_row(speed).t_ar) if history else None
    basis = (
        history.basis(timed is not None)
        + (f", their seconds a sample scaled x{timed[1]:.2f} by t_AR now over theirs" if timed else "")
        if history is not None
        else "priors (no earlier run of this task and pair in the cache)"
    )
    exponent = BATCH_EXPONENT.get(str(device).split(":")[0], BATCH_EXPONENT["cpu"])  # "cuda:1" prices as cuda
    mid = search.mid_n_draft
    prefill = 0.0 if speed is None else prefill_seconds(one_row(speed), max(search.n_drafts))

    def seconds(samples: int, n_draft: int, rows: int) -> float | None:
        if timed is not None:
            return samples * timed[0]
        if speed is None or samples == 0:
            return None if speed is None else 0.0
        round_seconds, gain = row_round(speed, n_draft, max(1, min(batch_size, rows)), exponent)
        per_token = round_seconds / (accept * n_draft + 1)
        return samples * (length_tokens * per_token + prompt_tokens * prefill) / gain

    def phase(name, samples, least, n_draft, rows, least_rows, detail) -> Phase:
        return Phase(
            name,
            samples,
            round(samples * length_tokens),
            seconds(samples, n_draft, rows),
            least,
            seconds(least, n_draft, least_rows),
            detail,
        )

    phases = []
    strict = n_search * repeats - strict_done
    grid_extra = max((max(0, search.trials - len(get_method(m).grid or [None])) for m in search.methods), default=0)
    other_n = min(len(search.n_drafts) - 1, grid_extra)  # sampled trials may move to other draft lengths
    phases.append(
        phase(
            f"strict N={mid}",
            strict,
            strict,
            mid,
            strict,
            strict,
            f"{n_search} problems x {repeats}"
            + (f", {strict_done} already recorded" if strict_done else "")
            + (f"; strict also runs at up to {other_n} other N the search may pick, not counted" if other_n else ""),
        )
    )
    stage = min(search.stage_size, n_search)
    for method in search.methods:
        per_trial, first = n_search * repeats, stage * repeats
        phases.append(
            phase(
                f"{method} trials",
                search.trials * per_trial,
                search.trials * first,
                mid,
                min(stage, n_search) * repeats,
                first,
                f"{search.trials} trials, each {per_trial} samples in stages of {stage} problems, "
                f"{first} if pruned after the first",
            )
        )
    confirm = n_confirm * repeats
    attempts = stats.confirmations * len(search.methods)
    phases.append(
        phase(
            "confirmations",
            attempts * 2 * confirm,
            0,
            mid,
            confirm,
            0,
            f"up to {stats.confirmations} per method, each {confirm} relaxed and {confirm} strict "
            + ("samples on the held-out problems" if stats.confirm == "holdout" else "samples on fresh seeds")
            + "; only when a point is chosen",
        )
    )

    now, saved = one_row(measured), one_row(saved)  # t_AR one row at a time, now and when saved
    slowdown = now.t_ar / saved.t_ar if now is not None and saved is not None else None
    avg, cores = load if load is not None else machine_load()
    busy = []
    if slowdown is not None and slowdown > BUSY_FACTOR:
        busy.append(
            f"one forward step takes {slowdown:.1f}x the saved profile's (t_AR {now.t_ar * 1e3:.0f} ms "
            f"now, {saved.t_ar * 1e3:.0f} ms saved)"
        )
    if avg is not None and avg > cores:
        busy.append(f"load average {avg:.1f} on {cores} core{'s' if cores > 1 else ''}")
    tps = None if speed is None else (accept * mid + 1) / one_row(speed).round_seconds(mid)
    here = history.finish_seconds if history is not None else None
    finish = here if here is not None else MLFLOW_SECONDS + FIGURE_SECONDS * figures
    return JobEstimate(
        phases,
        length_tokens,
        length_from,
        accept,
        tps,
        batch_size,
        slowdown,
        avg,
        cores,
        busy,
        elapsed,
        finish,
        basis=basis,
        t_ar=None if speed is None else one_row(speed).t_ar,
    )


def row_round(speed: CostProfile | ServingProfile, n_draft: int, rows: int, exponent: float) -> tuple[float, float]:
    """``(seconds of one round of one row alone, gain of ``rows`` rows together)``: a single
    profile prices the round at batch 1 and the gain as ``rows ** exponent``; a serving
    profile at the largest measured batch size ``b <= rows`` (else its smallest): a row's
    share of a batched round, ``round_seconds_b(N) / b``, with the gain ``(rows / b) ** exponent``
    beyond ``b``; ``seconds = work per row / gain`` (see the module doc).

    Raises:
        ValueError: ``rows`` below 1.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if not isinstance(speed, ServingProfile):
        return speed.round_seconds(n_draft), rows**exponent
    b = max((size for size in speed.batch_sizes if size <= rows), default=speed.batch_sizes[0])
    return speed.at(b).round_seconds(n_draft) / b, (rows / b) ** exponent if rows > b else 1.0


def prefill_seconds(profile: CostProfile, n_draft: int) -> float:
    """Seconds to prefill one prompt token in both models: a token of the verify pass over
    ``n_draft + 1`` tokens (``t_verify(N+1) / (N+1)``), plus the drafter's share
    (``t_draft / t_AR`` of it)."""
    k = n_draft + 1
    per_token = profile.t_verify.get(k, profile.t_ar * k) / k if k > 1 else profile.t_ar
    return per_token * (1 + profile.t_draft / profile.t_ar)


def figure_count(methods: list[str], extra_per_method: int = 0) -> int:
    """Figures a tuning job's finish draws: the combined Pareto figure, and per method its
    Pareto figure and, for a method with a knob, its speed-vs-knob figure (``extra_per_method``:
    more per method, e.g. speed-up against batch size)."""
    return 1 + sum(1 + (1 if get_method(m).knob else 0) + extra_per_method for m in methods)
