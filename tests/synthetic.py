"""The synthetic evaluation with a known optimum, for tuner tests (no models): see
``relaxtune.testing.synthetic``."""

from relaxtune.testing.synthetic import PROBLEMS, SPEC, Synthetic, SyntheticPair, write_task

__all__ = ["PROBLEMS", "SPEC", "Synthetic", "SyntheticPair", "write_task"]
