"""Whole responses over a backend: one decode loop (``batch.generate_batch``, many
responses in one batch with continuous refill, the AR baseline and the native
server's requests through the same loop), one response as a batch of one
(``sequence.generate``), and a task's budgets and thinking protocol around both
(``responses``).

May import: decoding, backends, graders, tasks.
"""
