"""What a tuning job checks before any generation, each from the few settings it reads:
methods against the task's temperature, confirmations that can certify epsilon at the
confidence they are judged at, and studies that searched the same problems."""

from __future__ import annotations

from ..certify.planning import fewest_problems
from ..certify.stats import smallest_certifiable_drop
from ..decoding.methods import get_method
from .confirm import split_confidence
from .job_identity import study_name
from .search import valid_n
from .search_problems import check_problems, search_digest
from .storage import open_rdb

__all__ = [
    "ConfirmationError",
    "check_methods",
    "check_draft_lengths",
    "check_confirmable",
    "check_search_problems",
]


def check_methods(methods: list[str], temperature: float, n_drafts: list[int] | None = None) -> None:
    """Every method is known, defined at the task's sampling temperature and runs at one
    of ``n_drafts`` at least (the search leaves out the draft lengths a method cannot run
    at: FLy at N = 1, ``MethodSpec.check_n_draft``).

    Raises:
        ValueError: an unknown method, one that collapses at ``temperature``, or one that
            runs at none of ``n_drafts`` (naming ``--methods`` and ``--n-drafts``).
    """
    for method in methods:
        spec = get_method(method)
        spec.check_temperature(temperature)
        if n_drafts and not any(valid_n(spec, n) for n in n_drafts):
            try:
                spec.check_n_draft(min(n_drafts))
            except ValueError as err:
                raise ValueError(
                    f"--methods {method} with --n-drafts {','.join(map(str, n_drafts))}: {err}; "
                    "give a draft length it runs at"
                ) from None


def check_draft_lengths(n_drafts: list[int], max_new_tokens: int, flag: str = "--n-drafts") -> None:
    """Every draft length N fits the task's response budget: a round never drafts more
    tokens than a response may hold (``max_new_tokens``), and the models' caches are sized
    for the longest round, so a larger N only spends memory.

    Raises:
        ValueError: naming ``flag`` (``--n-drafts``; ``eval``'s ``--n-draft``), the longest N and
            the budget.
    """
    longest = max(n_drafts)
    if longest > max_new_tokens:
        raise ValueError(
            f"{flag} {','.join(map(str, n_drafts))}: a draft length of {longest} exceeds the task's "
            f"{max_new_tokens}-token response budget (max_new_tokens): give draft lengths up to {max_new_tokens}"
        )


class ConfirmationError(ValueError):
    """No confirmation of this job can pass, though its search could pass points (the message says what would)."""


def check_confirmable(problems: int, stats, repeats: int, planned: int) -> str | None:
    """Whether a confirmation of this job can certify epsilon at all, judged where the
    promise is: at ``split_confidence(confidence, planned)`` on the confirmation's
    problems (the held-out half, or all of them with ``--confirm seeds``), with no
    discordance at all. Returns None when it can, else a warning that names the
    confidence, the floor and the problems (``--limit``) that would let a
    confirmation pass.

    Raises:
        ConfirmationError: no confirmation can pass but the search could certify
            epsilon (its floor at ``confidence`` on its problems is at most epsilon):
            the job would search for points it can never confirm. When the search
            cannot certify either (a demo on a few problems), the job runs and
            recommends strict, and the warning says so.
    """
    holdout = stats.confirm == "holdout"
    held = problems // 2 if holdout else problems
    search = problems - held if holdout else problems
    each = split_confidence(stats.confidence, planned)
    floor = smallest_certifiable_drop(held, repeats, each) if held else 1.0
    if floor <= stats.epsilon:
        return None
    need = (2 if holdout else 1) * fewest_problems(stats.epsilon, each, repeats) if stats.epsilon > 0 else None
    where = (
        f"--confirm holdout keeps {held} of the {problems} problems for confirmation"
        if holdout
        else f"--confirm seeds confirms on the {problems} problems"
    )
    message = (
        f"no confirmation can pass: {where}, judged at {each:.4g} one-sided ({stats.confidence:g} split "
        f"over {planned} planned confirmation(s)), and their smallest certifiable drop is {floor:.3f} > epsilon "
        f"{stats.epsilon:g}; "
        + (
            f"at least {need} problems (--limit) would let a confirmation pass (fewer methods or "
            "--confirmations split the confidence less), or a larger --epsilon"
            if need
            else "no sample certifies a drop of 0 when relaxed and strict agree: use a larger --epsilon"
        )
        + "; `relaxtune plan` says what certifies with a given power"
    )
    search_floor = smallest_certifiable_drop(search, repeats, stats.confidence) if search else 1.0
    if search_floor <= stats.epsilon:
        raise ConfirmationError(message)
    return (
        f"{message}. The search cannot certify epsilon either (its {search} problems: {search_floor:.3f} at "
        f"{stats.confidence:g}): this job explores and will recommend strict"
    )


def check_search_problems(
    storage_url: str, methods: list[str], spec, pair: str, problems, confirm: str, scope: str = "all"
) -> str:
    """With ``--confirm holdout``, refuse studies holding trials searched on other
    problems (another ``--limit``, ``--seed`` or ``--confirm``): they may have
    seen the held-out half. Fresh seeds are independent of every search sample,
    so ``--confirm seeds`` resumes any study (``scope``: the job's ``--relaxation-scope``, in
    the studies' names). Returns the search problems' digest.

    Raises:
        SearchProblemsError: such a study, naming the fix.
    """
    import optuna

    digest = search_digest(problems)
    if confirm != "holdout":
        return digest
    storage = open_rdb(storage_url)
    try:
        names = set(optuna.study.get_all_study_names(storage=storage))
        for method in methods:
            name = study_name(spec.name, method, pair, spec.version, scope)
            if name in names:
                check_problems(optuna.load_study(study_name=name, storage=storage), digest)
    finally:
        storage.engine.dispose()
    return digest
