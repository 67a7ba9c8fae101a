"""Whole responses over a backend: one sequence at a time (``sequence.generate``, the AR
baseline through the same loop), many in one batch with continuous refill
(``batch.generate_batch``), and a task's budgets and thinking protocol around both
(``responses``).

May import: decoding, backends, graders, tasks.
"""
