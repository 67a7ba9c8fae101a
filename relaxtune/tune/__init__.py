"""The search: a point and its evaluation records on disk (``point_records``), the
evaluation that generates, grades and records them (``evaluation``), the job's settings
(``settings``; their groups: ``setting_groups``; the serving batch sizes resolved on this
machine: ``serving_sizes``; the job's and its studies' names: ``job_identity``), the Optuna
storage the workers share and its locks (``storage``), Optuna studies, their queues and
heartbeats (``studies``), the problems a study searched (``search_problems``), where a study
looks after the grid (``search``), trials and their stages (``tuning``, ``outcomes``), a
point's paired metrics and the loss constraint (``judge``), problem ranges (``ranges``),
confirmation runs (``confirm``), the speed margin (``recommend``), a job's costs and its
best confirmed point per serving batch size (``batches``), points and Pareto
fronts (``pareto``), which specs need tuning (``schedule``), progress lines
(``progress``), the job's time estimate (``estimate``), its plan (``estimate_plan``), how
the job announces it and keeps its measures (``estimate_announce``) and how a job stops
or fails (``stopping``). A finished job leaves as a frozen ``JobResult`` (``result``:
what ``report/`` reads); every call of Optuna beyond its public API is in
``optuna_compat`` (with its contract test); file locks are ``filelock``'s.

May import: decoding, certify, backends, graders, tasks, engine.
"""
