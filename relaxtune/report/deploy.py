"""``deploy:`` blocks: one exported point in each serving engine's own syntax.

For a point (method id, named knobs, draft length N, sampling) of a measured pair,
``deploy_blocks`` returns one block per engine that runs the point's rule, each
validated against that engine's own constraints; a constraint the point breaks
gives ``{"refused": why}`` for that engine instead. Every block names the engine
version, the exact weights that were measured (``weights``) and the sampling. A
rule no engine ships gives one line. ``plain_blocks`` is the recommendation when
no speculative point pays: plain decoding of the verifier.

Engines, versions and constraints (``docs/reference/engine-rules.md``):
- vLLM 0.33.0 ``--speculative-config`` JSON: lossless ``rejection_sample_method``
  ``standard``; FLy ``fly`` with ``fly_window_size``, ``fly_entropy_threshold``,
  ``fly_entropy_top_k`` (``vllm/config/speculative.py:652-660``), validated at
  :2014-2033 (``num_speculative_tokens >= 2``, ``fly_window_size <
  num_speculative_tokens``); CPU raises ``NotImplementedError``.
- TensorRT-LLM 0.20.0+ ``speculative_config:`` YAML (``--extra_llm_api_options``):
  ``MTPDecodingConfig`` ``use_relaxed_acceptance_for_thinking``, ``relaxed_topk``
  (> 0), ``relaxed_delta`` (>= 0); greedy only (``mtp.py``
  ``MTPWorker.sample_and_accept_draft_tokens``: "Currently only support greedy
  sampling"); runs with MTP heads, not a separate drafter.
- SGLang 0.5.23 launch args ``--speculative-accept-threshold-single/-acc``
  (``sglang/srt/arg_groups/fields/spec.py:109-116``), values in [0, 1]
  (``jit/csrc/speculative/sampling.cuh:76-77``), changeable by ``POST
  /set_internal_state`` (``entrypoints/http_server.py:895-903``, allow-list
  ``managers/scheduler_components/internal_state.py:168-185``); the kernel runs on
  CUDA and non-greedy rows only (``speculative/eagle_utils.py:485-500``).
- transformers 5.14.0+ ``generate()``: ``assistant_ensemble_weight`` in (0, 1)
  (5.24.0 ``generation/configuration_utils.py:672-676``), sampling path only
  (``generation/utils.py`` ``_speculative_sampling``); batch size 1. The blocks pin
  ``num_assistant_tokens`` = N, ``num_assistant_tokens_schedule="constant"`` and
  ``assistant_confidence_threshold`` 0 on the assistant's generation config
  (``assistant_config``), which transformers would otherwise choose.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..decoding.deployable import ENGINES, RUNS
from ..decoding.engine_rules import ensemble_weight
from ..decoding.fly import FLY_THRESHOLD, FLY_TOP_K, fly_window
from ..decoding.methods import get_method
from ..decoding.trtllm import TRT_DELTA, TRT_TOPK

__all__ = ["ENGINES", "VERSIONS", "assistant_config", "deploy_blocks", "engines_running", "plain_blocks", "weights"]

VERSIONS = {
    "vllm": "vLLM 0.33.0",
    "sglang": "SGLang 0.5.23",
    "trtllm": "TensorRT-LLM 0.20.0 (first release with relaxed MTP acceptance, by date)",
    "transformers": "transformers 5.14.0",
}
_VLLM_CHECK = "vLLM 0.33.0 vllm/config/speculative.py:2014-2033"
_SGLANG_RANGE = "SGLang 0.5.23 jit/csrc/speculative/sampling.cuh:76-77"
_SGLANG_GREEDY = "speculative/eagle_utils.py:485-500 (SGLang 0.5.23): the threshold kernel skips all-greedy batches"
_TRT_GREEDY = (
    "tensorrt_llm/_torch/speculative/mtp.py MTPWorker.sample_and_accept_draft_tokens: "
    "'Currently only support greedy sampling'"
)
_HF_RANGE = "generation/configuration_utils.py:672-676 (transformers 5.24.0): assistant_ensemble_weight in (0, 1)"


def engines_running(method: str) -> tuple[str, ...]:
    """The engines (``ENGINES`` names) that ship ``method``'s rule; empty when none does."""
    return RUNS.get(get_method(method).id, ())


def weights(model: str, dtype: str | None, runtime: str | None) -> dict:
    """The exact weights a run measured for ``model`` and how they ran.

    On ``llamacpp`` a GGUF file runs as is: its format is ``GGUF <type>``, the type read
    from the file's own metadata (``relaxtune.backends.gguf_info.gguf_quant_type``; an
    embedded model whose file is not on disk: its registry's Q4_K_M). On ``hf`` the
    model runs at ``dtype`` (an embedded GGUF dequantised to it); on ``sglang`` at the
    server's dtype (``dtype``: ``relaxtune.backends.sglang_costs.served_dtype``).
    Embedded models (``relaxtune.backends.embedded``) are GGUF Q4_K_M repackagings
    pinned by size and sha256 (the drafter a re-quantised AWQ variant), not the hub model.

    Returns:
        ``{"model", "format", "runtime"}`` plus, for embedded models, ``"upstream"``,
        ``"packages"``, ``"sha256"`` and a ``"note"``.
    """
    from ..backends.embedded import EMBEDDED

    runtime = runtime or "hf"
    em = EMBEDDED.get(model)
    if runtime == "llamacpp":
        fmt = f"GGUF {_gguf_type(model, em is not None)}"
    elif runtime == "sglang":
        fmt = f"as served by SGLang ({dtype or 'as served'})"
    else:
        fmt = f"GGUF Q4_K_M dequantised to {dtype}" if em is not None else str(dtype)
    out: dict[str, Any] = {"model": model, "format": fmt, "runtime": runtime}
    if em is None:
        return out
    awq = "a re-quantisation of an AWQ variant of " if em.name.startswith("qwen2.5-coder-0.5b") else ""
    out.update(
        upstream=em.hf_id,
        packages=f"{em.package}1..{em.parts}=={em.version}",
        sha256=em.sha256,
        note=f"GGUF Q4_K_M, {awq}{em.hf_id}; not the hub weights: serving {em.hf_id} will not reproduce "
        "the measured acceptance exactly",
    )
    return out


def _gguf_type(model: str, embedded: bool) -> str:
    """The GGUF file's quantisation type, from its metadata; an embedded model's registry type
    (Q4_K_M) when its file is not on disk or llama.cpp cannot read it; else says why not."""
    from ..backends.gguf_info import embedded_gguf, gguf_quant_type
    from ..backends.llamacpp_model import LlamaCppMissing

    path = embedded_gguf(model)
    try:
        if path is None:
            raise FileNotFoundError(f"no GGUF file {model}")
        return gguf_quant_type(str(path))
    except (FileNotFoundError, ValueError, LlamaCppMissing) as err:
        return "Q4_K_M" if embedded else f"(type not read: {err})"


def _sampling(sampling: dict) -> dict:
    return {k: sampling.get(k) for k in ("temperature", "top_p", "top_k")}


def _greedy(sampling: dict) -> bool:
    return not sampling.get("temperature")


def _vllm(method: str, named: dict | None, n: int, drafter: str, verifier: str, sampling: dict) -> dict:
    cfg: dict[str, Any] = {
        "method": "draft_model",
        "model": drafter,
        "num_speculative_tokens": n,
        "draft_sample_method": "probabilistic",
    }
    if method == "strict":
        cfg["rejection_sample_method"] = "standard"
    else:
        w = fly_window(named, n)
        if n < 2:
            return {"refused": f"FLy needs num_speculative_tokens >= 2 ({_VLLM_CHECK}); this point has N={n}"}
        if w >= n:
            return {
                "refused": f"FLy needs fly_window_size < num_speculative_tokens ({_VLLM_CHECK}); "
                f"this point has fly_window_size={w}, N={n}"
            }
        cfg.update(
            rejection_sample_method="fly",
            fly_window_size=w,
            fly_entropy_threshold=named[FLY_THRESHOLD],
            fly_entropy_top_k=named[FLY_TOP_K],
        )
    spec = json.dumps(cfg, separators=(",", ":"))
    out = {
        "launch_args": ["vllm", "serve", verifier, "--speculative-config", spec],
        "request_sampling": _sampling(sampling),
    }
    if method != "strict":
        out["note"] = "FLy is lossy and CUDA/ROCm only (CPU raises NotImplementedError); engine-wide"
    return out


def _sglang(method: str, named: dict | None, n: int, drafter: str, verifier: str, sampling: dict) -> dict:
    from ..backends.sglang_native import chain_flags

    args = ["--model-path", verifier, "--speculative-draft-model-path", drafter, *chain_flags(n)]
    out: dict[str, Any] = {"launch_args": args, "request_sampling": _sampling(sampling)}
    if method == "strict":
        return out
    if _greedy(sampling):
        return {
            "refused": f"SGLang's thresholds act on non-greedy rows only ({_SGLANG_GREEDY}); "
            "this point was measured at temperature 0"
        }
    values = {k: float(named[k]) for k in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc")}
    bad = {k: v for k, v in values.items() if not 0.0 <= v <= 1.0}
    if bad:
        return {"refused": f"SGLang needs thresholds in [0, 1] ({_SGLANG_RANGE}); got {bad}"}
    for k, v in values.items():
        args += ["--" + k.replace("_", "-"), f"{v:g}"]
    out.update(
        set_internal_state={"server_args": values},
        note="CUDA only (ROCm, CPU, XPU ignore the thresholds); server-wide; change at run time with "
        "POST /set_internal_state; not with --speculative-use-rejection-sampling",
    )
    return out


def _trtllm(method: str, named: dict | None, n: int, drafter: str, verifier: str, sampling: dict) -> dict:
    if method == "strict":
        return {
            "speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": n, "speculative_model": drafter},
            "note": "lossless draft/target decoding (tensorrt_llm.llmapi.DraftTargetDecodingConfig)",
            "launch_args": ["trtllm-serve", verifier, "--backend", "pytorch", "--extra_llm_api_options", "args.yaml"],
            "request_sampling": _sampling(sampling),
        }
    if not _greedy(sampling):
        return {
            "refused": f"TensorRT-LLM's relaxed acceptance is greedy-only ({_TRT_GREEDY}); this point was "
            f"measured at temperature {sampling.get('temperature')}"
        }
    return {
        "speculative_config": {
            "decoding_type": "MTP",
            "num_nextn_predict_layers": n,
            "use_relaxed_acceptance_for_thinking": True,
            "relaxed_topk": int(named[TRT_TOPK]),
            "relaxed_delta": float(named[TRT_DELTA]),
        },
        "launch_args": ["trtllm-serve", verifier, "--backend", "pytorch", "--extra_llm_api_options", "args.yaml"],
        "request_sampling": {"temperature": 0.0},
        "note": f"measured with a separate drafter ({drafter}), not MTP heads: TensorRT-LLM runs this rule only "
        "with the verifier's MTP heads, whose drafts differ; the rule is the same, the acceptance will not be",
    }


def _transformers(method: str, named: dict | None, n: int, drafter: str, verifier: str, sampling: dict) -> dict:
    kwargs: dict[str, Any] = {"assistant_model": drafter}
    if _greedy(sampling):
        if method != "strict":
            return {
                "refused": "transformers' greedy path takes the argmax of the mixture, another rule than "
                "relaxtune's ens (measured on the sampling path); measure at temperature > 0"
            }
        kwargs["do_sample"] = False
    else:
        kwargs.update(do_sample=True, **{k: v for k, v in _sampling(sampling).items() if v is not None})
    if method != "strict":
        w = ensemble_weight(float(named["alpha"]))
        if w is not None and not 0.0 < w < 1.0:
            return {"refused": f"{_HF_RANGE}; alpha {named['alpha']} gives {w}"}
        if w is not None:
            kwargs["assistant_ensemble_weight"] = w
    return {
        "generate_kwargs": kwargs,
        "assistant_generation_config": assistant_config(n),
        "note": "set assistant_generation_config on assistant_model.generation_config (transformers reads the "
        "draft length there, not from generate()'s keywords); one sequence at a time (batch size 1)",
    }


def assistant_config(n_draft: int) -> dict:
    """The assistant's generation-config fields that pin transformers' draft length to N.
    transformers 5.24.0 ``generation/candidate_generator.py``
    ``AssistedCandidateGenerator.__init__`` reads them from
    ``assistant_model.generation_config`` (defaults 20, ``"constant"``, 0.4: the
    confidence threshold stops drafting early), not from ``generate()``'s keywords."""
    return {
        "num_assistant_tokens": n_draft,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }


_BUILD = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "transformers": _transformers}


def deploy_blocks(
    method: str,
    knob: Any,
    n_draft: int,
    sampling: dict,
    drafter: str,
    verifier: str,
    dtype: str | None,
    runtime: str | None = None,
    scope: str = "all",
) -> dict | str:
    """The ``deploy:`` blocks of one point.

    Args:
        method: method id; knob: alpha or a mapping of named knobs (None for strict;
            every searched knob as searched: SGLang's two thresholds each at its value);
        n_draft: draft length N; sampling: the task's ``{temperature, top_p, top_k}``;
        drafter, verifier, dtype, runtime: the measured pair and how it ran.
        scope: the point's relaxation scope (``relaxtune.decoding.scope``); at ``thinking``
            an engine whose rule relaxes at every position is refused in one line (only a
            rule keyed on thinking by itself, TensorRT-LLM's, keeps its block).

    Returns:
        engine -> block (``engine``, ``weights``, ``sampling`` and the engine's own
        syntax; or ``engine``, ``refused``) for every engine that ships the rule, in
        ``ENGINES`` order; a strict point (a relaxed rule at its strict knob
        included) gives every engine's lossless config; a string (one line) when no
        engine ships the rule.

    Raises:
        ValueError: an unknown method, or a knob outside the method's range.
    """
    spec = get_method(method)
    if isinstance(knob, Mapping):  # a record's knobs leave a derived knob out (FLy's W): the engine derives it
        knob = {k.name: None for k in spec.knobs if k.derived} | dict(knob)
    named = spec.named(knob) if spec.has_knob else None
    if spec.is_strict(named if named is not None else knob):
        method, named = "strict", None
    engines = engines_running(method)
    if not engines:
        why = spec.engine.removeprefix("no engine ships this").lstrip(":; ")
        return (
            f"no engine ships {spec.id}" + (f" ({why})" if why else "") + "; only relaxtune's own verify loop runs it"
        )
    ws = {"drafter": weights(drafter, dtype, runtime), "verifier": weights(verifier, dtype, runtime)}
    from ..backends.embedded import EMBEDDED

    d_id, v_id = (EMBEDDED[m].hf_id if m in EMBEDDED else m for m in (drafter, verifier))
    out = {}
    for e in engines:
        block = _BUILD[e](method, named, n_draft, d_id, v_id, dict(sampling))
        head = {"engine": VERSIONS[e]}
        out[e] = head | block if "refused" in block else head | {"weights": ws, "sampling": dict(sampling)} | block
    return _scoped(out, get_method(method), scope)


def _scoped(blocks: dict, spec, scope: str) -> dict:
    """``blocks`` with each engine that cannot relax in thinking only refused in one line
    (scope ``thinking``; a lossless point, and a rule whose ``RoundRule.thinking_scoped``,
    keep their blocks)."""
    if scope == "all" or spec.id == "strict" or (spec.round_rule is not None and spec.round_rule.thinking_scoped):
        return blocks
    return {
        e: block
        if "refused" in block
        else {
            "engine": block["engine"],
            "refused": f"{spec.id} was measured relaxing inside <think>...</think> only (scope thinking); "
            f"{e} applies it at every position: only TensorRT-LLM's relaxed acceptance is thinking-scoped",
        }
        for e, block in blocks.items()
    }


def plain_blocks(
    verifier: str, sampling: dict, dtype: str | None, runtime: str | None = None, reason: str = ""
) -> dict:
    """Plain decoding of the verifier, for every engine, when no speculative point pays on
    the measured costs: "serve the verifier alone" in each engine's own syntax (vLLM and
    TensorRT-LLM serve commands, SGLang launch args, transformers ``generate()`` keywords),
    with no drafter and no speculative argument, the measured verifier's weights and the
    sampling."""
    from ..backends.embedded import EMBEDDED

    v_id = EMBEDDED[verifier].hf_id if verifier in EMBEDDED else verifier
    head = {
        "decoding": "plain",
        "weights": {"verifier": weights(verifier, dtype, runtime)},
        "sampling": dict(sampling),
        "note": "serve the verifier alone: no speculative point pays on the measured costs"
        + (f" ({reason})" if reason else ""),
    }
    hf = (
        {"do_sample": False}
        if _greedy(sampling)
        else {"do_sample": True, **{k: v for k, v in _sampling(sampling).items() if v is not None}}
    )
    return {
        "vllm": {"engine": VERSIONS["vllm"], "launch_args": ["vllm", "serve", v_id]} | head,
        "sglang": {"engine": VERSIONS["sglang"], "launch_args": ["--model-path", v_id]} | head,
        "trtllm": {"engine": VERSIONS["trtllm"], "launch_args": ["trtllm-serve", v_id, "--backend", "pytorch"]} | head,
        "transformers": {"engine": VERSIONS["transformers"], "generate_kwargs": hf} | head,
    }
