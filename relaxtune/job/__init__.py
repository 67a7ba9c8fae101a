"""The main job, end to end, as the README's "What the main job does" tells it:

1. ``prepare``: every check before generation, then the task's problems and the pair;
   the stores, created and migrated once whoever starts first (``relaxtune.report.stores``);
   the forward costs (``relaxtune.backends.costs``);
2. strict as the baseline, at every draft length a trial used;
3. one Optuna study per method (``relaxtune.tune.tuning.Tuner``);
4. confirmation of each method's chosen point on samples the search never saw
   (``relaxtune.tune.confirm``);
5. MLflow runs (``relaxtune.report.tracking``);
6. the tuned config (``relaxtune.report.export``).

``relaxtune.job.run``: ``tune_job`` and ``export_job``, two short compositions of the
shared steps of ``relaxtune.job.steps`` (``start_job``, ``make_tuner``, ``run_studies``,
``choose_and_confirm``, ``write_config``); ``report/`` receives the finished job frozen
(``Tuner.result``: ``relaxtune.tune.result.JobResult``), never the live tuner. The CLI
(``relaxtune tune`` / ``export``) and the Prefect flow (``flows/tune.py``) call
``run_tune_job``, which runs one or the other.

May import: every wing.
"""
