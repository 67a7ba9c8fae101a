"""What a job leaves for people and for serving: MLflow runs of a job and of its exports
(``tracking``, ``mlflow_runs``; logged off the job's critical path by ``background``;
their stores made once by ``stores``), the decision as params, metrics, tags and description
(``decision``), figures (``figures``; speed-up by serving batch size: ``batch_figure``),
the tuned config (its schema: ``config_schema``; built, saved and loaded: ``export``) and
what an export reads and writes, a re-pricing on a serving host's costs included
(``reexport``). It reads a finished job as ``relaxtune.tune.result.JobResult``
(frozen), never the live tuner; every call of MLflow beyond its public API is in
``mlflow_compat`` (with its contract test).

May import: decoding, certify, backends, graders, tasks, engine, tune.
"""
