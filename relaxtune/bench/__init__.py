"""Benchmarks: scripts that print ratios measured side by side in one run.

May import: every wing, ``relaxtune.job`` and ``testing``.
"""
