"""The transfer matrix: reading tuned configs and judging every source point on every
target task (``run``), its cells and the configs' sections (``matrix``), the heatmap
(``figure``) and its MLflow runs (``tracking``).

May import: decoding, certify, backends, graders, tasks, engine, tune, report.
"""
