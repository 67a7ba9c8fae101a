"""Simulated benchmark tasks with known accuracy and acceptance surfaces over (knob, N),
for the tuning benchmark (``relaxtune.bench.tuning``).

A ``SimTask`` draws, from one seed, a task shaped like one of the paper's
evaluations (``FAMILIES``: problems x repeats, strict accuracy, response length)
and, for each method, surfaces over (knob, N):

- acceptance: tokens are accepted i.i.d. with per-token probability ``beta``, so a
  round of draft length N accepts a truncated geometric number of drafts
  (mean ``beta (1 - beta^N) / (1 - beta)``); strict has ``beta0 + e_j`` on problem j,
  and a relaxation raises it towards ``beta_max`` as ``beta0 + (beta_max - beta0) g``,
  where ``g(knob)`` in [0, 1) is the method's acceptance gain, rising with the knob
  and saturating (``GAINS``; its knob scale varies per task, so a knob value that is
  mild on one task is strong on another);
- accuracy: problem j is solved by strict with probability ``s_j`` (Beta around the
  family's accuracy, so some problems are always and some never solved) and by the
  relaxed point with ``s_j (1 - min(1, D c_j))``, ``c_j`` its susceptibility (mean 1:
  harm concentrates in some problems), ``D = loss sigmoid((g - cliff) / width) a``:
  flat, then falling past a task-dependent cliff, scaled by the share of emitted
  tokens that are accepted drafts ``a = l / (l + 1)`` (longer drafts relax more tokens);
- length: ``L_j`` (lognormal per problem and sample, capped at the paper's 36,864
  tokens, which counts as truncated), times ``1 + ramble sigmoid((g - ramble_at) / width)``
  for a method that rambles (ens most, the verifier-anchored cactus and mentored little).

Samples follow the product's pairing: strict's samples depend on (problem,
repeat, N, base seed); a relaxed point's on the same plus the point. Responses
are thousands of tokens long, so one relaxed acceptance re-rolls the rest of the
trajectory: a relaxed sample is drawn independently of strict's, and common
random numbers pair only the problem (a knob at the method's strict point
returns strict's samples). The truth of a point (``SimTask.truth``: accuracy drop,
modeled speed-up) is its expectation over problems drawn like the task's
(``POPULATION`` of them), which is what the product's drop bound speaks about.

Calibration, and what it is not: the shapes follow the paper's findings as the
repository's spec states them (``docs/concepts/relaxed-rules.md``: N in
{3, 5, 10, 20}, c_rel in {0.05, 0.2, 0.5}, AIME 30 x 48, GPQA 198 x 6,
LiveCodeBench 175 x 6 samples, thinking budget 32,768 and 36,864 tokens in total,
relaxations that ramble with weak drafters, CACTUS and mentored alike, a good
alpha on one task hurting another). Strict's per-token acceptance spans
0.6 to 0.93; the top comes from our own embedded runs (the Qwen2.5-Coder pair's
strict l_accept of 1.80, 3.51, 5.79 at N = 2, 4, 8 in the README is
beta = 0.93 to 0.95). Everything else (strict accuracies, response lengths, the
acceptance ceiling, where cliffs sit, how much accuracy they cost) is our
assumption: we have no access to the paper's tables beyond what the spec doc
states, so these tasks test the SEARCH on plausible shapes; they do not reproduce
the paper's numbers. The samples are also smaller than the paper's, so that the
benchmark runs in minutes: AIME 30 x 16 (not 48), GPQA 66 x 6 and
LiveCodeBench 58 x 6 (a third of their problems).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from relaxtune.decoding.methods import get_method
from relaxtune.decoding.speed import speedup
from relaxtune.tasks.spec import Problem, TaskSpec
from relaxtune.tune.point_records import EvalResult, summarize

__all__ = [
    "Family",
    "FAMILIES",
    "GAINS",
    "Surface",
    "SimTask",
    "Truth",
    "SimPair",
    "truncated_geometric",
    "PAPER_N",
    "PAPER_C_REL",
    "MAX_TOKENS",
    "POPULATION",
]

PAPER_N = (3, 5, 10, 20)  # the paper's draft lengths
PAPER_C_REL = (0.05, 0.2, 0.5)  # the paper's c_rel sweep
MAX_TOKENS = 36864  # the paper's total generation limit (thinking budget 32,768 plus the answer)
POPULATION = 20000  # problems drawn like the task's for its truth
LENGTH_SPREAD = 0.3  # sd of log length between samples of one problem
PROBLEM_LENGTH_SPREAD = 0.5  # sd of log mean length between problems
ACCEPT_SPREAD = 0.03  # sd of the per-problem offset of per-token acceptance


@dataclass(frozen=True)
class Family:
    """The shape of one of the paper's evaluations.

    Attributes:
        name: short id; problems, repeats: the paper's sample (problems x samples each).
        accuracy: strict's mean accuracy (our assumption); length: mean response tokens (our assumption).
        epsilon: the allowed accuracy drop the benchmark tunes with (at 0.9 one-sided confidence,
            30 problems cannot certify less than 0.086 however many repeats, so AIME gets 0.15).
    """

    name: str
    problems: int
    repeats: int
    accuracy: float
    length: float
    epsilon: float


FAMILIES = {
    f.name: f
    for f in (
        Family("aime", 30, 16, 0.75, 12000.0, 0.15),
        Family("gpqa", 66, 6, 0.65, 6000.0, 0.1),
        Family("lcb", 58, 6, 0.55, 9000.0, 0.1),
    )
}

# acceptance gain g(knob, scale) in [0, 1), rising with the knob and saturating, per method
GAINS = {
    "cactus": lambda k, s: 1.0 - math.exp(-math.sqrt(max(k, 0.0) / s)),  # boost ~ sqrt(2 delta p (1 - p))
    "mentored": lambda k, s: 1.0 - (1.0 - min(k, 1.0)) ** (1.0 / s),  # ratio test scaled by 1 / (1 - alpha)
    "ens": lambda k, s: 1.0 - math.exp(-max(k, 0.0) / s),  # mixture weight alpha on q
}
_SCALES = {"cactus": (0.05, 2.0), "mentored": (0.7, 2.5), "ens": (0.03, 0.3)}  # log-uniform knob scale ranges
_CEILING = {"cactus": (0.95, 0.99), "mentored": (0.9, 0.97), "ens": (0.95, 0.99)}  # beta_max (mentored: p(x) > 0)
_RAMBLE = {"cactus": (0.0, 0.1), "mentored": (0.0, 0.15), "ens": (0.1, 0.8)}  # length growth past the onset


def truncated_geometric(beta: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of accepted drafts per round (tokens) when each of ``n`` drafts is
    accepted with probability ``beta`` until the first rejection: ``P(A = k) = beta^k (1 - beta)``
    for k < n, ``P(A = n) = beta^n``. ``beta`` any shape, in [0, 1); returns two arrays of its
    shape. The mean is ``beta (1 - beta^n) / (1 - beta)`` (``relaxtune.tune.search.accepted_per_round``)."""
    beta = np.asarray(beta, dtype=np.float64)
    k = np.arange(n + 1, dtype=np.float64)
    pk = beta[..., None] ** k * np.where(k < n, 1.0 - beta[..., None], 1.0)
    mean = (pk * k).sum(-1)
    return mean, np.maximum((pk * k * k).sum(-1) - mean**2, 0.0)


def _mean_accepted(beta: np.ndarray, n: int) -> np.ndarray:
    return beta * (1.0 - beta**n) / (1.0 - beta)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(x, 50.0), -50.0)))


@dataclass(frozen=True)
class Surface:
    """One method's surfaces on one task (module doc).

    Attributes:
        method: method id (a ``GAINS`` key); scale: the knob scale of its gain.
        beta_max: per-token acceptance the relaxation saturates at.
        cliff, width: the gain at which accuracy falls, and how sharply.
        loss: share of strict's successes lost past the cliff when every token is an accepted draft.
        ramble, ramble_at: length growth past the gain ``ramble_at``.
    """

    method: str
    scale: float
    beta_max: float
    cliff: float
    width: float
    loss: float
    ramble: float
    ramble_at: float

    def gain(self, knob: float) -> float:
        """The acceptance gain g in [0, 1) at ``knob`` (0 at the strict point)."""
        return GAINS[self.method](float(knob), self.scale)

    def harm(self, knob: float) -> float:
        """``loss sigmoid((g - cliff) / width)``: the share of successes lost per accepted-draft share."""
        return self.loss * _sigmoid((self.gain(knob) - self.cliff) / self.width)

    def length_ratio(self, knob: float) -> float:
        """Expected L_relax / L_strict before the token cap."""
        return 1.0 + self.ramble * _sigmoid((self.gain(knob) - self.ramble_at) / self.width)


@dataclass(frozen=True)
class Truth:
    """A point's expectation over problems like the task's: ``drop`` (accuracy units),
    ``speedup`` (the paper's model at the task's c_rel), ``l_accept`` (tokens per round),
    ``length_ratio``."""

    drop: float
    speedup: float
    l_accept: float
    length_ratio: float


class SimPair:
    """The backend a simulated task names (nothing to load): ``name``."""

    def __init__(self, name: str = "simulated-pair") -> None:
        self.name = name


@dataclass
class _Problems:
    """Per-problem parameters ``[P]``: strict success, susceptibility, acceptance offset, mean length."""

    s: np.ndarray
    c: np.ndarray
    e: np.ndarray
    length: np.ndarray

    @classmethod
    def draw(cls, rng: np.random.Generator, family: Family, n: int) -> _Problems:
        a = 1.0  # Beta(a mu, a (1 - mu)): most problems near always or never solved
        s = rng.beta(a * family.accuracy, a * (1.0 - family.accuracy), n)
        c = rng.gamma(1.0, 1.0, n)  # susceptibility, mean 1
        e = rng.normal(0.0, ACCEPT_SPREAD, n)
        mu = math.log(family.length) - PROBLEM_LENGTH_SPREAD**2 / 2 - LENGTH_SPREAD**2 / 2
        return cls(s, c, e, np.exp(rng.normal(mu, PROBLEM_LENGTH_SPREAD, n)))


@dataclass
class SimTask:
    """One simulated task: its family, c_rel, strict acceptance and the methods' surfaces.
    Callable as ``relaxtune.tune.evaluation.evaluate`` (same signature), so a ``Tuner`` runs on it.

    Attributes:
        family, seed: what it was drawn from; c_rel: drafter/verifier cost ratio (a ``PAPER_C_REL`` value).
        beta0: strict's mean per-token acceptance; surfaces: method -> ``Surface``.
        calls: ``(method, knob, n_draft, problems, seed)`` per evaluation.
    """

    family: Family
    seed: int
    c_rel: float
    beta0: float
    surfaces: dict[str, Surface]
    calls: list[tuple] = field(default_factory=list, repr=False)
    _problems: _Problems = field(init=False, repr=False)
    _population: _Problems = field(init=False, repr=False)
    _lengths: np.ndarray = field(init=False, repr=False)
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def draw(cls, family: Family | str, seed: int, methods: tuple[str, ...] = ("cactus", "mentored", "ens")) -> SimTask:
        """Draw a task of ``family`` from ``seed`` (module doc).

        Raises:
            ValueError: an unknown family, or a method without simulated surfaces (``GAINS``).
        """
        if isinstance(family, str):
            if family not in FAMILIES:
                raise ValueError(f"unknown task family {family!r}; known: {', '.join(FAMILIES)}")
            family = FAMILIES[family]
        unknown = [m for m in methods if m not in GAINS]
        if unknown:
            raise ValueError(f"no simulated surfaces for {', '.join(unknown)}; simulated methods: {', '.join(GAINS)}")
        rng = np.random.default_rng([zlib.crc32(family.name.encode()), seed])
        c_rel = float(rng.choice(PAPER_C_REL))
        beta0 = float(rng.uniform(0.6, 0.93))
        cliff = float(rng.uniform(0.3, 0.95))  # shared by the methods (cactus and mentored behave alike) ...
        surfaces = {}
        for m in methods:
            lo, hi = _SCALES[m]
            surfaces[m] = Surface(
                m,
                float(math.exp(rng.uniform(math.log(lo), math.log(hi)))),
                float(rng.uniform(*_CEILING[m])),
                cliff=float(np.clip(cliff + rng.normal(0.0, 0.08), 0.05, 0.98)),  # ... up to a jitter
                width=float(rng.uniform(0.03, 0.1)),
                loss=float(math.exp(rng.uniform(math.log(0.03), math.log(0.8)))),
                ramble=float(rng.uniform(*_RAMBLE[m])),
                ramble_at=float(np.clip(cliff + rng.uniform(-0.1, 0.2), 0, 1)),
            )
        task = cls(family, seed, c_rel, beta0, surfaces)
        task._problems = _Problems.draw(rng, family, family.problems)
        truth_rng = np.random.default_rng([zlib.crc32(family.name.encode()), seed, zlib.crc32(b"population")])
        task._population = _Problems.draw(truth_rng, family, POPULATION)
        task._lengths = task._population.length * np.exp(
            truth_rng.normal(-(LENGTH_SPREAD**2) / 2, LENGTH_SPREAD, POPULATION)
        )  # one sample per problem
        return task

    # ---------------------------------------------------------------- surfaces

    @property
    def name(self) -> str:
        """``<family>-<seed>``."""
        return f"{self.family.name}-{self.seed}"

    def spec(self) -> TaskSpec:
        """A task spec with the family's repeats and token limit (its dataset is never read)."""
        return TaskSpec(
            name=f"sim-{self.name}",
            version=1,
            dataset={"path": "json", "data_files": "unused.jsonl"},
            grader={"kind": "math"},
            repeats=self.family.repeats,
            max_new_tokens=MAX_TOKENS,
        )

    def problems(self) -> list[Problem]:
        """The task's problems (ids ``"0"`` ...)."""
        return [Problem(str(j), f"simulated problem {j}", "") for j in range(self.family.problems)]

    def _beta(self, method: str | None, knob: float | None, e: np.ndarray) -> np.ndarray:
        beta = self.beta0
        if method is not None:
            s = self.surfaces[method]
            beta += (s.beta_max - self.beta0) * s.gain(knob)
        return np.clip(beta + e, 0.01, 0.995)

    def _point(self, method: str | None, knob: float | None, n_draft: int, p: _Problems) -> dict[str, np.ndarray]:
        """Per-problem success probability, per-token acceptance and length factor of a point on ``p``."""
        beta = self._beta(method, knob, p.e)
        if method is None:
            return {"success": p.s, "beta": beta, "ratio": 1.0}
        s = self.surfaces[method]
        mean = float(_mean_accepted(self._beta(method, knob, np.zeros(1)), n_draft)[0])
        share = mean / (mean + 1.0)  # accepted drafts among emitted tokens
        loss = np.minimum(1.0, s.harm(knob) * share * p.c)
        return {"success": p.s * (1.0 - loss), "beta": beta, "ratio": s.length_ratio(knob)}

    def _is_strict(self, method: str | None, knob: float | None) -> bool:
        return method is None or method == "strict" or get_method(method).is_strict(knob)

    def truth(self, method: str | None, knob: float | None, n_draft: int) -> Truth:
        """The point's expectation over ``POPULATION`` problems drawn like the task's (``method``
        None: strict): accuracy drop vs strict, modeled speed-up at the task's c_rel (``L_AR`` =
        strict's mean length, lengths capped at ``MAX_TOKENS``), l_accept, length ratio."""
        if self._is_strict(method, knob):
            method = knob = None
        key = ("truth", method, knob, n_draft)
        if key not in self._cache:
            pop = self._population
            point = self._point(method, knob, n_draft, pop)
            l_strict = np.minimum(self._lengths, MAX_TOKENS)
            l_relax = np.minimum(self._lengths * point["ratio"], MAX_TOKENS)
            mean = _mean_accepted(point["beta"], n_draft)
            rounds = l_relax / (mean + 1.0)
            l_accept = float((rounds * mean).sum() / rounds.sum())
            ratio = float(l_relax.mean() / l_strict.mean())
            drop = float(np.mean(pop.s - point["success"]))
            self._cache[key] = Truth(drop, speedup(l_accept, n_draft, self.c_rel, 1.0, ratio), l_accept, ratio)
        return self._cache[key]

    # ----------------------------------------------------------------- samples

    def _samples(self, method: str | None, knob: float | None, n_draft: int, seed: int) -> list[list[dict]]:
        """Per problem, its ``repeats`` records (cached per point and seed)."""
        if self._is_strict(method, knob):
            method = knob = None
        knob_id = None if knob is None else f"{float(knob):.9g}"  # knobs equal to 9 digits: one trajectory
        key = ("samples", method, knob_id, n_draft, seed)
        if key in self._cache:
            return self._cache[key]
        point_id = 0 if method is None else zlib.crc32(f"{method}:{knob_id}".encode())
        rng = np.random.default_rng([self.seed, n_draft, seed & 0xFFFFFFFF, point_id])
        p, shape = self._problems, (self.family.problems, self.family.repeats)
        point = self._point(method, knob, n_draft, p)
        correct = rng.random(shape) < point["success"][:, None]
        raw = p.length[:, None] * point["ratio"] * np.exp(rng.normal(-(LENGTH_SPREAD**2) / 2, LENGTH_SPREAD, shape))
        length = np.clip(np.rint(raw), 1, MAX_TOKENS).astype(np.int64)
        mean, var = (np.broadcast_to(v[:, None], shape) for v in truncated_geometric(point["beta"], n_draft))
        rounds = np.maximum(1, np.rint(length / (mean + 1.0))).astype(np.int64)
        accepted = np.rint(rounds * mean + np.sqrt(rounds * var) * rng.standard_normal(shape))
        accepted = np.clip(accepted, 0, rounds * n_draft).astype(np.int64)
        out = []
        for j in range(shape[0]):
            out.append(
                [
                    dict(
                        problem_id=str(j),
                        repeat=r,
                        seed=seed,
                        failed=False,
                        correct=bool(correct[j, r]),
                        verdict="correct" if correct[j, r] else "wrong",
                        output="",
                        finish_reason="length" if length[j, r] >= MAX_TOKENS else "stop",
                        response_tokens=int(length[j, r]),
                        stats={"rounds": int(rounds[j, r]), "accepted": int(accepted[j, r]), "wall_seconds": 1.0},
                    )
                    for r in range(shape[1])
                ]
            )
        self._cache[key] = out
        return out

    def __call__(self, spec, backend, config, *, output_dir, problems, progress) -> EvalResult:
        """``relaxtune.tune.evaluation.evaluate``'s signature: the records of ``problems`` at ``config``
        (nothing is written)."""
        self.calls.append((config.method, config.knob, config.n_draft, len(problems), config.seed))
        method = None if config.method == "strict" else config.method
        per_problem = self._samples(method, config.knob, config.n_draft, config.seed)
        records = [r for p in problems for r in per_problem[int(p.id)]]
        return summarize(records, Path(output_dir) / f"{config.label}.jsonl")
