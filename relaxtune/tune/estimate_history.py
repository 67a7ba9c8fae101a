"""What earlier tuning jobs of a task with a model pair measured, kept in the cache for
the next job's first estimate (``relaxtune.tune.estimate``).

A finished job adds one run to ``<folder>/<task>-v<version>/<pair>.json`` (``<folder>``:
``$RELAXTUNE_ESTIMATES``, default ``<cache>/estimates`` with ``<cache>`` ``$RELAXTUNE_CACHE``
or ``~/.cache/relaxtune``; ``off`` keeps none; ``<pair>``: the records folder's name,
drafter, verifier and runtime), keeping the last ``KEEP`` runs:

- the response tokens a sample (``tokens decoded / samples generated``) and the share
  of drafts accepted (``(tokens decoded - rounds) / drafted tokens``: a round emits its
  accepted drafts plus the verifier's own token); these hold for the task and pair on
  any host;
- on the host that ran it (``host_key``: CPU model and the cores the process may use),
  the wall seconds a generated sample took (strict, the trials and the confirmations,
  over the samples generated), the finish (MLflow, export, figures) and the one-row
  ``t_AR`` the job measured at its start: the speed it ran at.

The next job's estimate rests on them when present: the length and acceptance from
every run, and the seconds a sample scaled by this run's ``t_AR`` over theirs (the
machine now faster or slower, busier or idler): this host's runs when there are any,
else every run's that measured its t_AR (a step of the verifier as the unit of time
across hosts; rougher, said so). Without a file of its own, a task and pair that
relaxtune's developers ran ship a seed (``SEEDS``: the README's main job, measured
idle); the plan says which it rests on. A file that cannot be read counts as no history. The seconds a sample
hold for jobs that decode as many rows together (batch size, problems per stage) as those
runs did; a job of another shape is priced at them too, and the estimate said after strict
(``JobEstimate.revised``) corrects it from the job's own samples.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..backends.embedded import cache_dir

__all__ = ["RunMeasure", "History", "history_path", "host_key", "measure_run", "remember", "recall", "KEEP"]

KEEP = 5  # runs kept per task and pair (all hosts together), the newest last
SCHEMA = 1
SEEDS = Path(__file__).with_name("estimate_seeds.json")  # <task>-v<version>/<pair> -> runs, shipped


@dataclass(frozen=True)
class RunMeasure:
    """What one finished job measured.

    Attributes:
        host: ``host_key()`` of the machine that ran it.
        samples: samples it generated (>= 1).
        tokens_per_sample: response tokens a sample.
        accept: accepted drafts over drafted tokens, 0..1 (None: no drafts counted).
        seconds_per_sample: wall seconds a generated sample took (strict, trials, confirmations).
        t_ar: the one-row verifier step (seconds) measured at its start (None: a fixed c_rel).
        finish_seconds: wall seconds of its finish (MLflow, export, figures).
    """

    host: str
    samples: int
    tokens_per_sample: float
    accept: float | None
    seconds_per_sample: float
    t_ar: float | None
    finish_seconds: float


@dataclass(frozen=True)
class History:
    """The runs kept for a task and pair, read for ``host``.

    Attributes:
        path: the file they came from.
        runs: every kept run (any host).
        host: the host asking (``host_key()``).
    """

    path: Path
    runs: tuple[RunMeasure, ...]
    host: str

    @property
    def here(self) -> tuple[RunMeasure, ...]:
        """The runs made on ``host``."""
        return tuple(r for r in self.runs if r.host == self.host)

    @property
    def tokens_per_sample(self) -> float:
        """Response tokens a sample over every run (weighted by samples)."""
        return sum(r.tokens_per_sample * r.samples for r in self.runs) / sum(r.samples for r in self.runs)

    @property
    def accept(self) -> float | None:
        """Share of drafts accepted over the runs that counted drafts (weighted by samples)."""
        rows = [r for r in self.runs if r.accept is not None]
        return sum(r.accept * r.samples for r in rows) / sum(r.samples for r in rows) if rows else None

    def seconds_per_sample(self, t_ar: float | None) -> tuple[float, float] | None:
        """``(wall seconds a sample on this host now, the t_AR scale applied)``: this host's
        runs' seconds a sample, each times ``t_ar`` over its own t_AR (1 when either is
        unknown), weighted by samples; without a run on this host, every run's that measured
        its t_AR, scaled alike; None when neither applies (no t_AR now, or none then). The
        scale is the scaled mean over the unscaled one."""
        runs = self.here or (tuple(r for r in self.runs if r.t_ar) if t_ar else ())
        if not runs:
            return None
        weight = sum(r.samples for r in runs)
        raw = sum(r.seconds_per_sample * r.samples for r in runs) / weight
        now = sum(r.seconds_per_sample * r.samples * (t_ar / r.t_ar if t_ar and r.t_ar else 1.0) for r in runs) / weight
        return now, (now / raw if raw > 0 else 1.0)

    @property
    def finish_seconds(self) -> float | None:
        """This host's mean finish seconds (None without a run here)."""
        here = self.here
        return sum(r.finish_seconds for r in here) / len(here) if here else None

    def basis(self, timed: bool) -> str:
        """What the estimate rests on, one clause; ``timed``: the runs' seconds a sample were used."""
        n, h = len(self.runs), len(self.here)
        if h:
            where = f"{h} of them on this host"
        elif timed:
            where = "none on this host: other hosts' seconds a sample, in steps of the verifier"
        else:
            where = "none on this host: the time priced from the cost profile"
        used = "lengths, acceptance and seconds a sample" if timed else "lengths and acceptance"
        runs = f"{n} earlier run{'s' if n > 1 else ''} of this task and pair"
        if self.path.resolve() == SEEDS.resolve():
            runs += ", shipped with relaxtune (its developers' run; none of yours in the cache yet)"
        return f"{used} of {runs} ({where}; {self.path})"


def history_path(task: str, version: int, pair: str) -> Path | None:
    """``<folder>/<task>-v<version>/<pair>.json`` (see the module doc); None when
    ``$RELAXTUNE_ESTIMATES`` is ``off``."""
    folder = os.environ.get("RELAXTUNE_ESTIMATES", "").strip()
    if folder.lower() == "off":
        return None
    return Path(folder or cache_dir() / "estimates").expanduser() / f"{task}-v{version}" / f"{pair}.json"


def host_key() -> str:
    """The machine as the history keys it: CPU model name (``/proc/cpuinfo``, else
    ``platform.processor()`` or the machine type) and the cores this process may use."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return f"{model or platform.processor() or platform.machine()}, {cores} cores"


def measure_run(timer: dict, t_ar: float | None, host: str | None = None) -> RunMeasure | None:
    """A finished job's ``RunMeasure`` from its phase table (``PhaseTimer.to_dict()``:
    counts ``samples generated``, ``tokens decoded``, ``rounds``, ``drafted tokens``;
    phases ``strict``, ``trials``, ``confirmations``, ``MLflow``, ``export``, ``figures``);
    None when it generated nothing (all read from records: nothing measured)."""
    counts = timer.get("counts", {})
    samples = int(counts.get("samples generated", 0))
    if samples < 1:
        return None
    walls: dict[str, float] = {}
    for p in timer.get("phases", []):
        if not p.get("overlapped"):
            walls[p["name"]] = walls.get(p["name"], 0.0) + float(p["wall"])
    tokens = float(counts.get("tokens decoded", 0))
    drafted = float(counts.get("drafted tokens", 0))
    accept = min(1.0, max(0.0, (tokens - float(counts.get("rounds", 0))) / drafted)) if drafted > 0 else None
    generating = sum(walls.get(n, 0.0) for n in ("strict", "trials", "confirmations"))
    return RunMeasure(
        host or host_key(),
        samples,
        tokens / samples,
        accept,
        generating / samples,
        t_ar,
        sum(walls.get(n, 0.0) for n in ("MLflow", "export", "figures")),
    )


def remember(path: Path | None, run: RunMeasure | None) -> Path | None:
    """Add ``run`` to the history at ``path`` (the last ``KEEP`` kept; written atomically);
    returns the path, or None when there was nothing to keep (no path, no run) or the
    cache cannot be written."""
    if path is None or run is None:
        return None
    runs = list(_read(path)) + [run]
    data = {"schema": SCHEMA, "updated": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": [asdict(r) for r in runs[-KEEP:]]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def recall(path: Path | None, host: str | None = None) -> History | None:
    """The history at ``path`` read for ``host`` (default ``host_key()``); without a readable
    file there, the shipped seed of its task and pair (``SEEDS``, the history's ``path``
    then); None when there is neither (or no path: ``off``)."""
    runs = _read(path) if path is not None else ()
    if runs:
        return History(path, runs, host or host_key())
    seeded = _seed(path) if path is not None else ()
    return History(SEEDS, seeded, host or host_key()) if seeded else None


def _seed(path: Path) -> tuple[RunMeasure, ...]:
    """The shipped runs (``SEEDS``) of the task and pair ``path`` names
    (``.../<task>-v<version>/<pair>.json``)."""
    try:
        seeds = json.loads(SEEDS.read_text())
        rows = seeds.get(f"{path.parent.name}/{path.stem}", [])
        return tuple(RunMeasure(**r) for r in rows)
    except (OSError, ValueError, TypeError, AttributeError):
        return ()


def _read(path: Path) -> tuple[RunMeasure, ...]:
    try:
        data = json.loads(Path(path).read_text())
        if data.get("schema") != SCHEMA:
            return ()
        runs = tuple(RunMeasure(**r) for r in data["runs"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ()
    return tuple(r for r in runs if r.samples >= 1 and r.seconds_per_sample >= 0 and r.tokens_per_sample >= 0)
