"""A tuning job's plan, as ``estimate_job`` (``relaxtune.tune.estimate``) prices it: its
phases (``Phase``: the samples and tokens each generates, and its wall seconds, at full
size and when it ends early), the priors and the machine's state the plan rests on, and
the whole job's wall time (``JobEstimate.job_seconds``: the time spent before the plan,
strict and every trial, the finish). After strict the job revises it from strict's own
wall time a sample (``JobEstimate.revised``). ``JobEstimate.lines`` is the plan as the job
prints it, times as ``clock`` writes them; past ``BUSY_FACTOR`` (this run's t_AR over the
saved profile's) it also says what the job would take at the saved (idle) speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Phase", "JobEstimate", "clock", "BUSY_FACTOR"]

BUSY_FACTOR = 1.25  # t_AR this many times the saved profile's: the machine is slower than when it was saved


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
