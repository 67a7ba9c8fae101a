"""The problems a study searches: their digest (``search_digest``), which a study records
as its user attr ``search_problems`` before its first trial, and the refusal of a study
holding trials searched on other problems (``check_problems``): with ``--confirm
holdout`` they may have seen the held-out half. Checked as a study is set up
(``studies.TrialQueue.open``, under the storage's lock) and before any generation
(``checks.check_search_problems``).
"""

from __future__ import annotations

import hashlib

import optuna

__all__ = ["SearchProblemsError", "check_problems", "search_digest"]


class SearchProblemsError(ValueError):
    """A study holds trials searched on other problems than this job's (the message says what to do)."""


def check_problems(study: optuna.Study, digest: str) -> None:
    """Refuse a study that holds trials (any state, queued ones too) searched on other
    problems than those of ``digest`` (``search_digest``): with ``--confirm holdout``
    they may have seen the held-out half.

    Raises:
        SearchProblemsError: naming the study and the fix.
    """
    if study.get_trials(deepcopy=False) and study.user_attrs.get("search_problems") != digest:
        raise SearchProblemsError(
            f"study {study.study_name} holds trials searched on other problems (another --limit, --seed or --confirm), "
            "which may include the held-out half: --confirm holdout needs a fresh study (another --output-dir / "
            "--storage), or use --confirm seeds"
        )


def search_digest(problems) -> str:
    """The digest of the problems a study searches (their ids, in order): a study's
    user attr ``search_problems``, set before its first trial, so that ``--confirm
    holdout`` never resumes a study that searched other problems."""
    return hashlib.sha256("\n".join(p.id for p in problems).encode()).hexdigest()[:16]
