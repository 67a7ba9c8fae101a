"""relaxtune: per-task tuning of relaxed speculative decoding.

Nine wings, each importing only those before it: ``decoding`` (the relaxed
rules, their registry, the sampling transform, one verification round, the speed
model), ``certify`` (the drop bound and sample sizes), ``backends`` (in-process
transformers, SGLang servers, the embedded pair), ``graders`` and ``tasks``
(capability), ``engine`` (whole responses and batches), ``tune`` (records,
studies, search, judging, confirmation), ``report`` (MLflow, figures, the tuned
config) and ``transfer``; then ``job`` (the main job), ``cli`` (the command line),
``bench``, ``testing`` and ``flows`` (the Prefect flows). The layers are declared
once, as import-linter contracts in ``pyproject.toml`` (``lint-imports``). The
decoding core's entry points are re-exported here.
"""

from importlib.metadata import PackageNotFoundError, version

from . import _started  # noqa: F401 - first: the clock of a command's "imports" phase starts before the rest
from .decoding.methods import METHODS, MethodSpec, get_method
from .decoding.round import BatchRoundResult, RoundResult, verify_round, verify_rounds
from .decoding.sampling import SamplingParams

try:
    __version__ = version("relaxtune")  # the installed distribution's, from pyproject.toml: defined once
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "METHODS",
    "MethodSpec",
    "get_method",
    "SamplingParams",
    "verify_round",
    "verify_rounds",
    "RoundResult",
    "BatchRoundResult",
]
