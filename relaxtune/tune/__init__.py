"""The search: evaluation records (``evaluation``), the job's settings (``settings``),
Optuna studies, their queues, heartbeats and lock (``studies``), where a study looks
after the grid (``search``), trials and their stages (``tuning``, ``outcomes``), a
point's paired metrics and the loss constraint (``judge``), problem ranges (``ranges``),
confirmation runs (``confirm``), the speed margin (``recommend``), points and Pareto
fronts (``pareto``), which specs need tuning (``schedule``), progress lines
(``progress``), the job's plan and time estimate (``estimate``) and how a job stops
or fails (``stopping``).

May import: decoding, certify, backends, graders, tasks, engine.
"""
