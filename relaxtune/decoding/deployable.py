"""Which rules a serving engine runs, and at which sampling: the filter behind
``relaxtune tune --deployable-on ENGINE`` and the engine list of every ``deploy:``
block (``relaxtune.report.deploy``). Versions and sources:
``docs/reference/engine-rules.md``.

- ``vllm`` (0.33.0+): ``strict`` (``rejection_sample_method: "standard"``) and ``fly``
  (greedy and sampled requests).
- ``sglang`` (0.5.23): ``strict`` and ``sglang_threshold``, which its kernel applies to
  non-greedy rows only (``speculative/eagle_utils.py:485-500``).
- ``trtllm`` (0.20.0+): ``strict`` (draft/target) and ``trtllm_relaxed``, greedy only.
- ``transformers`` (5.14.0+): ``strict`` and ``ens`` (``assistant_ensemble_weight``,
  sampling path only: its greedy path is another rule); assisted generation runs one
  sequence at a time (batch size 1).

Pure values.
"""

from __future__ import annotations

from collections.abc import Iterable

from .methods import get_method

__all__ = ["ENGINES", "RUNS", "deployable_methods"]

ENGINES = ("vllm", "sglang", "trtllm", "transformers")
RUNS: dict[str, tuple[str, ...]] = {  # method -> the engines that run its rule
    "strict": ENGINES,
    "fly": ("vllm",),
    "sglang_threshold": ("sglang",),
    "trtllm_relaxed": ("trtllm",),
    "ens": ("transformers",),
}
_GREEDY_ONLY = {"trtllm_relaxed": "TensorRT-LLM runs relaxed acceptance greedy only"}
_SAMPLED_ONLY = {
    "sglang_threshold": "SGLang applies its thresholds to non-greedy rows only",
    "ens": "transformers' greedy ensemble is another rule (argmax of the mixture)",
}


def deployable_methods(engines: Iterable[str], methods: Iterable[str], temperature: float) -> tuple[list[str], dict]:
    """Keep the methods one of ``engines`` runs at ``temperature``; refuse the rest by name.

    Args:
        engines: engine names (``ENGINES``), several allowed; methods: method ids;
        temperature: the task's sampling temperature (0: greedy).

    Returns:
        ``(kept, refused)``: kept method ids in the given order; refused: method ->
        why (one line naming the engines and the rule's limits).

    Raises:
        ValueError: an unknown engine (listing the known ones), no engine, or an
            unknown method.
    """
    engines = list(dict.fromkeys(engines))
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise ValueError(f"unknown engine(s) {', '.join(unknown) or '(none given)'}; use {', '.join(ENGINES)}")
    greedy = not temperature
    kept, refused = [], {}
    for m in methods:
        spec = get_method(m)
        runs = [e for e in RUNS.get(spec.id, ()) if e in engines]
        if not runs:
            where = ", ".join(RUNS.get(spec.id, ())) or "no engine"
            refused[m] = f"{m}: not run by {', '.join(engines)} (runs on {where})"
        elif greedy and spec.id in _SAMPLED_ONLY:
            refused[m] = f"{m}: {_SAMPLED_ONLY[spec.id]}; the task samples at temperature 0"
        elif not greedy and spec.id in _GREEDY_ONLY:
            refused[m] = f"{m}: {_GREEDY_ONLY[spec.id]}; the task samples at temperature {temperature:g}"
        else:
            kept.append(m)
    return kept, refused
