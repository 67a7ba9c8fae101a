"""A tuning job's plan and how long it should take, said before the first generation.

The plan counts samples and response tokens per phase: strict at each draft length
the search will use, every method's trials (each in stages of ``stage_size``
problems; pruning can stop it after the first), and the confirmations (only when a
point is chosen). The wall time prices those tokens with the forward costs just
measured (``relaxtune.decoding.speed.CostProfile``, one sequence at a time: a serving
profile's smallest batch size, ``one_row``):

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
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..decoding.methods import get_method
from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile
from .estimate_history import History, history_path, measure_run, recall, remember
from .progress import LENGTH_PRIOR, prior_length

__all__ = [
    "Phase",
    "JobEstimate",
    "estimate_job",
    "announce",
    "machine_load",
    "prior_length",
    "clock",
    "ACCEPT_PRIOR",
    "LENGTH_PRIOR",
    "BATCH_EXPONENT",
    "BUSY_FACTOR",
    "one_row",
    "FIGURE_SECONDS",
    "MLFLOW_SECONDS",
    "figure_count",
    "keep_measures",
]

ACCEPT_PRIOR = 0.6  # accepted drafts per round / N, before strict has run
BATCH_EXPONENT = {"cpu": 0.66, "cuda": 0.9, "llamacpp": 0.1}  # throughput of B rows = B ** exponent x one row's
BUSY_FACTOR = 1.25  # t_AR this many times the saved profile's: the machine is slower than when it was saved
FIGURE_SECONDS = 1.5  # one figure drawn (matplotlib Agg, two panels) and saved to PNG on a 2-core CPU (prior)
MLFLOW_SECONDS = 4.0  # the finish's MLflow calls on a local SQLite store: runs closed, tables, config (prior)


def one_row(profile) -> CostProfile | None:
    """The one-sequence costs the estimate prices with: a serving profile's at its
    smallest batch size (batch 1 unless the job measured without it), a
    ``CostProfile`` itself, None for a fixed c_rel."""
    if isinstance(profile, ServingProfile):
        return profile.at(profile.batch_sizes[0])
    return profile if isinstance(profile, CostProfile) else None


@dataclass
class Phase:
    """One phase of the job.

    Attributes:
        name: e.g. ``strict N=4``, ``cactus trials``, ``confirmations``.
        samples / tokens: what it generates at most (tokens: expected response tokens).
        seconds: expected wall seconds at that size (None without a cost profile).
        least_samples / least_seconds: when pruning or a failed search can end it early
            (a trial's first stage; no confirmation), else equal to the above.
        detail: how the count comes about, one clause.
    """

    name: str
    samples: int
    tokens: int
    seconds: float | None
    least_samples: int
    least_seconds: float | None
    detail: str


@dataclass
class JobEstimate:
    """The plan: phases, priors, the machine's state and the total.

    Attributes:
        phases: in the order the job runs them.
        length: expected response tokens per sample, and ``length_from`` where that comes from.
        accept: accepted drafts per round assumed, as a share of N.
        tokens_per_second: one sequence's decoding speed at the middle N (None: no profile).
        batch: rows decoded together.
        slowdown: this run's t_AR over the saved profile's (None: nothing to compare).
        load, cores: the 1-minute load average and the cores available.
        busy: why the machine looks busy (empty: it does not).
        elapsed: wall seconds the job spent before the plan (imports, model load, cost profiles).
        finish: expected wall seconds of the finish (MLflow's runs and the figures).
        revised_seconds: the job's wall seconds as revised after strict (``revised``), once said.
        basis: what the length, acceptance and time rest on (priors, or earlier runs kept in
            the cache: ``relaxtune.tune.estimate_history``), one clause.
        t_ar: the one-row verifier step it priced with (seconds; None: no profile).
        history_file: where this job's measures are kept for the next (None: nowhere).
    """

    phases: list[Phase]
    length: float
    length_from: str
    accept: float
    tokens_per_second: float | None
    batch: int
    slowdown: float | None
    load: float | None
    cores: int
    busy: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    finish: float = 0.0
    revised_seconds: float | None = None
    basis: str = ""
    t_ar: float | None = None
    history_file: Path | None = None

    @property
    def seconds(self) -> float | None:
        """Expected wall seconds of strict and every trial at full size, confirmations left
        out (they run only when a point is chosen; ``confirm_seconds``). None without a profile."""
        search = [p for p in self.phases if p.name != "confirmations"]
        return None if any(p.seconds is None for p in search) else sum(p.seconds for p in search)

    @property
    def least_seconds(self) -> float | None:
        """Wall seconds when every trial is pruned after its first stage."""
        search = [p for p in self.phases if p.name != "confirmations"]
        return None if any(p.least_seconds is None for p in search) else sum(p.least_seconds for p in search)

    @property
    def confirm_seconds(self) -> float | None:
        """Wall seconds of every confirmation the job allows (None without a profile)."""
        return next((p.seconds for p in self.phases if p.name == "confirmations"), 0.0)

    @property
    def job_seconds(self) -> float | None:
        """Expected wall seconds of the whole job: ``elapsed`` + strict and every trial at full
        size + ``finish`` (confirmations left out, as ``seconds``). None without a profile."""
        return None if self.seconds is None else self.elapsed + self.seconds + self.finish

    @property
    def search_samples(self) -> int:
        """Samples of strict and every trial at full size (confirmations left out)."""
        return sum(p.samples for p in self.phases if p.name != "confirmations")

    def revised(self, elapsed: float, samples: int, seconds: float) -> tuple[float, str]:
        """The job's wall seconds once ``samples`` samples took ``seconds`` (strict's, on the
        job's own problems) and ``elapsed`` seconds have passed: the search's other samples
        priced at that measured wall time a sample, plus the finish. Returns ``(seconds,
        the line the job prints)``.

        Raises:
            ValueError: ``samples`` below 1 or a time below 0.
        """
        if samples < 1 or min(elapsed, seconds) < 0:
            raise ValueError(f"revised: samples >= 1 and times >= 0 (got {samples}, {elapsed}, {seconds})")
        per_sample = seconds / samples
        left = max(self.search_samples - samples, 0)
        total = elapsed + left * per_sample + self.finish
        return total, (
            f"estimate after strict: about {clock(total)} for the job ({clock(elapsed)} so far; strict took "
            f"{seconds:.0f} s for {samples} samples, {per_sample:.1f} s a sample: the other {left} samples of the "
            f"trials priced alike, plus {clock(self.finish)} for MLflow and the figures; confirmations not counted)"
        )

    def lines(self) -> list[str]:
        """The plan as the job prints it: one line per phase, the estimate, the machine."""
        out = [f"plan: {p.name}: {_samples(p)}, about {_num(p.tokens)} tokens ({p.detail})" for p in self.phases]
        assumed = (
            f"{self.length:.0f} tokens per response ({self.length_from}), {self.accept:.0%} of N drafts "
            f"accepted, batch {self.batch}"
        )
        rests = f"rests on {self.basis}: " if self.basis else "assumes "
        if self.seconds is None:
            out.append(f"estimate: no wall time (no measured cost profile to price tokens with); {rests}{assumed}")
        else:
            out.append(
                f"estimate: about {clock(self.job_seconds)} for the job ({clock(self.elapsed)} so far, "
                f"{clock(self.finish)} for MLflow and the figures) of which {clock(self.seconds)} for strict "
                f"and the trials ({clock(self.least_seconds)}"
                f" if every trial is pruned after its first stage), plus up to {clock(self.confirm_seconds)} "
                f"when points are confirmed; at {self.tokens_per_second:.1f} tokens/s per sequence measured "
                f"now; {rests}{assumed}; the progress lines correct it from the measured throughput"
            )
        if self.busy:
            idle = (
                f"; at the saved profile's speed it would take about {clock(self.seconds / self.slowdown)}"
                if self.seconds is not None and self.slowdown and self.slowdown > BUSY_FACTOR
                else ""
            )
            out.append(
                f"machine looks busy: {'; '.join(self.busy)}. The estimate is at the speed measured now and "
                f"grows if the other work grows{idle}. For the README's timings run it on an idle machine."
            )
        return out


def _samples(p: Phase) -> str:
    if p.least_samples == p.samples:
        return f"{p.samples} samples"
    return f"{p.least_samples}-{p.samples} samples"


def _num(n: float) -> str:
    return f"{int(round(n)):,}"


def clock(seconds: float) -> str:
    """``h:mm:ss`` or ``m:ss`` of ``seconds`` (rounded)."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


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
    settings,
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
        settings: the job's ``TuneSettings`` (methods, trials, n_drafts, stage_size,
            confirmations).
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
    mid = settings.mid_n_draft
    prefill = 0.0 if speed is None else prefill_seconds(one_row(speed), max(settings.n_drafts))

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
    grid_extra = max((max(0, settings.trials - len(get_method(m).grid or [None])) for m in settings.methods), default=0)
    other_n = min(len(settings.n_drafts) - 1, grid_extra)  # sampled trials may move to other draft lengths
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
    stage = min(settings.stage_size, n_search)
    for method in settings.methods:
        per_trial, first = n_search * repeats, stage * repeats
        phases.append(
            phase(
                f"{method} trials",
                settings.trials * per_trial,
                settings.trials * first,
                mid,
                min(stage, n_search) * repeats,
                first,
                f"{settings.trials} trials, each {per_trial} samples in stages of {stage} problems, "
                f"{first} if pruned after the first",
            )
        )
    confirm = n_confirm * repeats
    attempts = settings.confirmations * len(settings.methods)
    phases.append(
        phase(
            "confirmations",
            attempts * 2 * confirm,
            0,
            mid,
            confirm,
            0,
            f"up to {settings.confirmations} per method, each {confirm} relaxed and {confirm} strict "
            + ("samples on the held-out problems" if settings.confirm == "holdout" else "samples on fresh seeds")
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


def announce(
    settings,
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
    batch = int(
        settings.batch_size or getattr(backend, "batch_size", None) or getattr(backend, "max_concurrency", None) or 1
    )
    strict = DecodeConfig("strict", None, settings.mid_n_draft, settings.seed)
    done = finished_samples(Path(settings.output_dir), spec, strict, getattr(backend, "name", "backend"), problems)
    kept = history_path(spec.name, spec.version, saved_path.parent.name)
    history = recall(kept)
    length = prior_length(saved_path.parent, spec.max_new_tokens)
    if history is not None and length[1].startswith("assumed"):
        length = None  # no record in this folder: the earlier runs' mean
    est = estimate_job(
        settings,
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
        figures=figure_count(list(settings.methods)),
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
