"""Which task specs need tuning: the ``tune_new`` flow's scheduled look at
``evals/`` (and any other folder of task specs).

A spec needs tuning when its task has no tuned config in the output folder
(``<output_dir>/<task>.tuned.yaml``), when that config was tuned for another
version of the task or another model pair, or when the spec file was modified
after the config was made (a task edited under the same version is refused by
the job itself, which then says so). ``unavailable`` tells, before any model
loads, which of them cannot be tuned (data that cannot load: a missing file, a
hub that cannot be reached; a response budget shorter than a draft length): the
flow skips those with a one-line reason.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..tasks.spec import evals_dirs, load_task

__all__ = ["Pending", "untuned", "unavailable"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pending:
    """A task spec to tune: ``name`` (the task), ``path`` (its YAML), ``reason`` (why)."""

    name: str
    path: str
    reason: str


def _tuned_at(config: dict, path: Path) -> float:
    """When a tuned config was made, in seconds since the epoch: its ``created`` field,
    else the file's modification time."""
    try:
        return dt.datetime.fromisoformat(str(config["created"])).timestamp()
    except (KeyError, TypeError, ValueError):
        return path.stat().st_mtime


def untuned(
    folders: list[str | os.PathLike] | None = None,
    output_dir: str | os.PathLike = "relaxtune-runs",
    pair: tuple[str, str] | None = None,
) -> list[Pending]:
    """The task specs of the search path (``evals_dirs()``) and ``folders`` (``*.yaml``) that need tuning,
    in name order; with ``pair`` (drafter, verifier as the job names them), a config
    tuned for another pair needs tuning too.

    A spec that does not load is skipped with a warning (the others still tune); a
    task name met again in a later folder is skipped with a warning (its tuned
    config would collide with the first one's).

    Raises:
        FileNotFoundError: a folder in ``folders`` does not exist.
    """
    extra = [Path(f) for f in folders or []]
    for d in extra:
        if not d.is_dir():
            raise FileNotFoundError(f"no folder of task specs at {d}")
    seen: dict[str, Path] = {}
    out = []
    for d in [*evals_dirs(), *extra]:
        for path in sorted(d.glob("*.yaml")):
            try:
                spec = load_task(path)
            except (ValueError, OSError) as err:
                _log.warning("skipping %s: %s", path, err)
                continue
            if spec.name in seen:
                if seen[spec.name].resolve() != path.resolve():
                    _log.warning("skipping %s: task %s is already defined by %s", path, spec.name, seen[spec.name])
                continue
            seen[spec.name] = path
            config_path = Path(output_dir) / f"{spec.name}.tuned.yaml"
            if not config_path.exists():
                out.append(Pending(spec.name, str(path), "never tuned"))
                continue
            config = yaml.safe_load(config_path.read_text()) or {}
            tuned_pair = (config.get("drafter"), config.get("verifier"))
            if config.get("task_version") != spec.version:
                out.append(
                    Pending(
                        spec.name,
                        str(path),
                        f"tuned for version {config.get('task_version')}, the spec is version {spec.version}",
                    )
                )
            elif pair is not None and tuned_pair != tuple(pair):
                out.append(
                    Pending(
                        spec.name,
                        str(path),
                        f"tuned for {tuned_pair[0]} -> {tuned_pair[1]}, not {pair[0]} -> {pair[1]}",
                    )
                )
            elif path.stat().st_mtime > _tuned_at(config, config_path):
                out.append(Pending(spec.name, str(path), "spec modified after its tuned config was made"))
    return sorted(out, key=lambda p: p.name)


def unavailable(pending: Pending, n_drafts: list[int] | None = None) -> str | None:
    """Why ``pending`` cannot be tuned (one line), or None when it can: its data cannot
    load (a missing file, a hub that cannot be reached, a field the data lacks), or a
    draft length of ``n_drafts`` exceeds its response budget (``max_new_tokens``, which
    the job itself refuses: ``relaxtune.tune.checks.check_draft_lengths``). Loads the
    task's data only (never a model)."""
    from ..tasks.spec import load_problems
    from .checks import check_draft_lengths

    spec = load_task(pending.path)  # untuned() has read it: it loads
    if n_drafts:
        try:
            check_draft_lengths(n_drafts, spec.max_new_tokens)
        except ValueError as err:
            return str(err)
    try:
        if not load_problems(spec, limit=1):
            return "its data holds no problems"
    except Exception as err:
        text = str(err).strip().splitlines()
        return f"its data cannot be loaded ({type(err).__name__}: {text[0] if text else ''})"
    return None
