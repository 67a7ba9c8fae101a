"""Idle workers help the running trials.

Near a job's end every trial is taken and the workers without one would wait
for the last trials (seconds to minutes each). Instead, such a worker evaluates a
range of a running trial's current stage that nobody holds or has recorded,
under the claim the trial's own worker takes for that range
(``relaxtune.tune.claims``; the ranges of a stage are ``split(stage end,
range_size)``, as ``Tuner._evaluate`` splits them), so each sample is still
generated once; the trial's worker then reads it from the records. Only the
stage the trial must finish anyway is helped (its end is the first stage end the
trial has not reported as ``stage_<end>``; a trial being pruned reports why
first): nothing is generated that pruning after the stage could make useless.
"""

from __future__ import annotations

from pathlib import Path

from .point_records import DecodeConfig, records_complete, records_name, records_path, trial_scope
from .ranges import current_stage, split
from .search import PRUNED_BY
from .stopping import environmental

__all__ = ["help_running", "stage_attr", "stages_done"]

_PREFIX = "stage_"


def stage_attr(end: int) -> str:
    """The user attr a trial's worker sets once the stage ending after ``end`` problems is done."""
    return f"{_PREFIX}{end}"


def stages_done(user_attrs: dict) -> set[int]:
    """The stage ends a trial has reported (``stage_attr``)."""
    return {int(k[len(_PREFIX) :]) for k in user_attrs if k.startswith(_PREFIX) and k[len(_PREFIX) :].isdigit()}


def help_running(tuner, studies: dict, tried: set) -> bool:
    """Evaluate one unclaimed, unrecorded range of the current stage of a running
    trial of ``studies`` (method -> Optuna study; any worker's trial, this one's
    other lanes included), as ``tuner`` (``relaxtune.tune.tuning.Tuner``) evaluates:
    its evaluation function, backend, task, problems and settings. ``tried`` (kept
    by the caller) holds the ranges taken before, never taken again.

    Returns:
        True when a range was evaluated; False when there was none to take, or the
        tuner evaluates a stage in one piece (``run_ranges``, or no ``range_size``),
        or the range failed (its trial's worker meets the same failure and records
        the trial as failed; this worker goes back to waiting).

    Raises:
        what ``environmental`` calls the machine's failure (a stop, a lost server):
        the job stops, as the trial's worker would.
    """
    from optuna.trial import TrialState

    s = tuner.settings
    if tuner.run_ranges is not None or s.range_size is None:
        return False
    n = len(tuner.problems)
    for method, study in studies.items():
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if "n_draft" not in t.params or PRUNED_BY in t.user_attrs:  # not drawn yet; being pruned
                continue
            problems = tuner.problems[: current_stage(stages_done(t.user_attrs), n, s.stage_size)]
            config = DecodeConfig.of_point(method, t.params, s.seed, trial_scope(t.params))
            name = records_name(tuner.backend, method)
            records = records_path(Path(s.output_dir), tuner.spec, config, name)
            for r in split(len(problems), s.range_size):
                part = problems[r.start : r.stop]
                key = (records, r.start, r.stop)
                if (
                    len(part) == len(problems)
                    or key in tried
                    or records_complete(s.output_dir, tuner.spec, config, name, part)
                ):
                    continue  # one range: the trial's worker's single piece; complete: nothing to help
                try:
                    if tuner.evaluate_range(config, problems, r, claimed=True) is None:
                        continue  # another worker holds it
                except Exception as err:
                    tried.add(key)
                    if environmental(err):
                        raise
                    tuner.log(
                        f"helping {method} trial {t.number} with problems {r.start}-{r.stop - 1} failed "
                        f"({type(err).__name__}: {err}); its worker evaluates them"
                    )
                    return False
                tried.add(key)
                return True
    return False
