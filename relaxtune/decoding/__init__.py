"""The decoding core: the relaxed rules (``rules``) and their registry (``methods``:
knobs, ranges, strict points, needs), the sampling transform (``sampling``), one
verification round (``round``: accept test, residual, bonus), the speed model and
cost profiles (``speed``), and the signs of rambling (``rambling``). Pure functions
on rows and numbers: no models, no tasks, no files.

May import: nothing of relaxtune outside this wing.
"""
