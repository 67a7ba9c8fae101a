"""What a tuning job checks before any generation, each from the few settings it reads:
methods against the task's temperature, a held-out half that can certify epsilon, and
studies that searched the same problems."""

from __future__ import annotations

import hashlib

from ..certify.planning import fewest_problems
from ..certify.stats import smallest_certifiable_drop
from ..decoding.methods import get_method
from .confirm import holdout_split
from .settings import study_name

__all__ = ["SearchProblemsError", "check_methods", "check_holdout", "check_search_problems"]


class SearchProblemsError(ValueError):
    """A study holds trials searched on other problems than this job's (the message says what to do)."""


def check_methods(methods: list[str], temperature: float) -> None:
    """Every method is known and defined at the task's sampling temperature.

    Raises:
        ValueError: an unknown method, or one that collapses at ``temperature``.
    """
    for method in methods:
        get_method(method).check_temperature(temperature)


def check_holdout(problems, seed: int, repeats: int, epsilon: float, confidence: float) -> None:
    """Refuse ``--confirm holdout`` when the held-out half of ``problems`` (split by
    ``seed``) cannot certify ``epsilon`` even with no discordance.

    Raises:
        ValueError: the half is too small, naming the problems that would do.
    """
    held = holdout_split(problems, seed)[1]
    floor = smallest_certifiable_drop(len(held), repeats, confidence) if held else 1.0
    if floor > epsilon:
        need = 2 * fewest_problems(epsilon, confidence, repeats)
        raise ValueError(f"--confirm holdout keeps {len(held)} of the {len(problems)} problems for confirmation, whose "
                         f"smallest certifiable drop is {floor:.3f} > epsilon {epsilon:g}: use --confirm "
                         f"seeds, at least {need} problems (--limit), or a larger --epsilon")


def check_search_problems(storage_url: str, methods: list[str], spec, pair: str, problems, confirm: str) -> str:
    """With ``--confirm holdout``, refuse studies holding trials searched on other
    problems (another ``--limit``, ``--seed`` or ``--confirm``): they may have
    seen the held-out half. Fresh seeds are independent of every search sample,
    so ``--confirm seeds`` resumes any study. Returns the search problems' digest.

    Raises:
        SearchProblemsError: such a study, naming the fix.
    """
    import optuna

    digest = hashlib.sha256("\n".join(p.id for p in problems).encode()).hexdigest()[:16]
    if confirm != "holdout":
        return digest
    names = set(optuna.study.get_all_study_names(storage=storage_url))
    for method in methods:
        name = study_name(spec.name, method, pair, spec.version)
        study = optuna.load_study(study_name=name, storage=storage_url) if name in names else None
        if study is not None and study.get_trials(deepcopy=False) and study.user_attrs.get("search_problems") != digest:
            raise SearchProblemsError(
                f"study {name} holds trials searched on other problems (another --limit, --seed or --confirm), "
                "which may include the held-out half: --confirm holdout needs a fresh study (another --output-dir / "
                "--storage), or use --confirm seeds")
    return digest
