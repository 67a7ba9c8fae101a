"""Contract with SGLang 0.5.23: response bodies built by SGLang's own functions
(from the pinned wheel's source, ``tests/sglang_source.py``) fed to relaxtune's
parsers, and compared with the stand-in's.

SGLang's code that runs here, unchanged:

- ``schedule_batch.py``: ``Req._compute_max_prefix_len`` (the prefix-cache cap at
  ``logprob_start_len``), ``compute_extend_logprob_start_len``, ``ReqLogprob``,
  the finish reasons;
- ``layers/logprob_processor.py``: ``get_top_logprobs_raw`` / ``get_token_ids_logprobs_raw``
  (top-K and ``token_ids_logprob`` values from a logprob matrix);
- ``scheduler_components/logprob_result_processor.py``:
  ``SchedulerLogprobResultProcessor`` (leading nulls, the id rewrite at
  ``vocab_size - 1``, length checks);
- ``tokenizer_manager.py``: ``ReqState`` and ``TokenizerManager.convert_logprob_style``,
  ``add_logprob_to_meta_info``, ``detokenize_*`` (the ``meta_info`` logprob
  fields, null text entries), ``_calculate_spec_decoding_metrics`` (``spec_*`` keys);
- ``scheduler_components/internal_state.py``: ``SchedulerInternalStateController``
  (``/set_internal_state``, ``internal_states``), ``RuntimeContext.resolved_server_args_dict``,
  and ``server_info`` of ``entrypoints/http_server.py``.

Mirrored here (a few lines each, marked ``mirror``): the logits processor's
gather of input logprobs, the output streamer's hand-off of one finished
request, the literal base ``meta_info`` of ``_handle_batch_output``, and the
parts of the scheduler and runtime context those functions read (stubs).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import typing
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from relaxtune.backends.sglang import parse_next, parse_score
from relaxtune.backends.sglang_native import SGLangError, parse_point, parse_spec_telemetry
from relaxtune.testing.sglang_standin import StandInServer

from .sglang_source import load

COMMON = {
    "dataclasses": dataclasses,
    "dataclass": dataclasses.dataclass,
    "logging": logging,
    "torch": torch,
    "np": np,
    "logger": logging.getLogger("sglang-contract"),
    "asyncio": asyncio,
    **{n: getattr(typing, n) for n in ("Any", "Dict", "List", "Optional", "Set", "Tuple", "Union", "Iterable")},
}
SPEC = NS(speculative_algorithm="STANDALONE", speculative_num_draft_tokens=5)  # what get_spec() answers


@pytest.fixture(scope="module")
def sgl():
    """SGLang 0.5.23's response builders, loaded from its source."""
    batch = load(
        "sglang/srt/managers/schedule_batch.py",
        {
            "BaseFinishReason": None,
            "FINISH_MATCHED_TOKEN": None,
            "FINISH_LENGTH": None,
            "ReqLogprob": None,
            "Req": ["_compute_max_prefix_len"],
            "compute_extend_logprob_start_len": None,
        },
        dict(COMMON),
    )
    lp = load(
        "sglang/srt/layers/logprob_processor.py",
        {
            "LogprobStage": None,
            "get_top_logprobs_raw": None,
            "get_top_logprobs": None,
            "get_token_ids_logprobs_raw": None,
            "get_token_ids_logprobs": None,
        },
        {**COMMON, "Enum": enum.Enum, "auto": enum.auto, "is_pin_memory_available": lambda device: False},
    )
    proc = load(
        "sglang/srt/managers/scheduler_components/logprob_result_processor.py",
        {"SchedulerLogprobResultProcessor": None},
        {**COMMON, "get_exec": lambda: NS(features=NS(enable_mis=False))},
    )
    tm = load(
        "sglang/srt/managers/tokenizer_manager.py",
        {
            "ReqState": None,
            "TokenizerManager": [
                "convert_logprob_style",
                "add_logprob_to_meta_info",
                "detokenize_logprob_tokens",
                "detokenize_top_logprobs_tokens",
                "_calculate_spec_decoding_metrics",
            ],
        },
        {**COMMON, "get_spec": lambda: SPEC, "_ragged_verify_cap_accept": lambda: False},
    )
    return NS(**{k: v for ns in (batch, lp, proc, tm) for k, v in ns.items() if not k.startswith("__")})


def sglang_generate(
    sgl, model, input_ids: list[int], logprob_start_len: int, top_k: int, token_ids: list[int] | None, radix_match: int
) -> dict:
    """The body SGLang 0.5.23 answers to a one-token greedy ``/generate`` with
    ``return_logprob`` (no stream), the prompt matching ``radix_match`` cached tokens."""
    vocab = int(model.config.vocab_size)
    req = object.__new__(sgl.Req)  # the fields _compute_max_prefix_len and the processor read
    req.__dict__.update(
        origin_input_ids=list(input_ids),
        logprob_start_len=logprob_start_len,
        return_logprob=True,
        dllm_config=None,
        is_dllm=lambda: False,
        is_prefill_only=False,
        token_indices_to_pool=None,
        multi_item_delimiter_indices=None,
        return_flat_raw_top_logprobs=False,
        input_token_logprobs=None,
        temp_input_top_logprobs_val=None,
        temp_input_top_logprobs_idx=None,
        temp_input_token_ids_logprobs_val=None,
        temp_input_token_ids_logprobs_idx=None,
        logprob=sgl.ReqLogprob(
            top_logprobs_num=top_k,
            token_ids_logprob=token_ids,
            output_token_logprobs_val=[],
            output_token_logprobs_idx=[],
            output_top_logprobs_val=[],
            output_top_logprobs_idx=[],
            output_token_ids_logprobs_val=[],
            output_token_ids_logprobs_idx=[],
        ),
    )
    prefix = min(radix_match, req._compute_max_prefix_len(len(input_ids)))
    extend = len(input_ids) - prefix
    start = sgl.compute_extend_logprob_start_len(
        logprob_start_len=logprob_start_len,
        prefix_len=prefix,
        extend_len=extend,
        full_untruncated_fill_len=len(input_ids),
    )
    processor = sgl.SchedulerLogprobResultProcessor(model_config=NS(vocab_size=vocab))
    pruned = processor.calculate_num_input_logprobs(req, extend, start)
    # mirror: the logits processor's input logprobs over the pruned positions (next ids clamped, 0-padded)
    first = prefix + start
    with torch.inference_mode():
        rows = model(input_ids=torch.tensor([input_ids])).logits[0].float().log_softmax(-1)[first:]
    next_ids = torch.tensor(input_ids[first + 1 :] + [0]).clamp(0, vocab - 1)
    stage = sgl.LogprobStage.PREFILL
    top_val, top_idx = sgl.get_top_logprobs_raw(rows, [top_k], stage, [pruned])
    ids_val, ids_idx = sgl.get_token_ids_logprobs_raw(rows, [token_ids], stage, [pruned])
    last = rows[-1:]
    nxt = int(last.argmax())
    out_top_val, out_top_idx = sgl.get_top_logprobs(last, [top_k])
    out_ids_val, out_ids_idx = sgl.get_token_ids_logprobs(last, [token_ids])
    output = NS(
        input_token_logprobs=tuple(rows[torch.arange(pruned), next_ids].tolist()),
        input_top_logprobs_val=top_val,
        input_top_logprobs_idx=top_idx,
        input_token_ids_logprobs_val=ids_val,
        input_token_ids_logprobs_idx=ids_idx,
        next_token_logprobs=[float(last[0, nxt])],
        next_token_top_logprobs_val=out_top_val,
        next_token_top_logprobs_idx=out_top_idx,
        next_token_token_ids_logprobs_val=out_ids_val,
        next_token_token_ids_logprobs_idx=out_ids_idx,
    )
    processor.add_logprob_return_values(0, req, 0, [nxt], pruned, output)
    lg = req.logprob  # mirror: the output streamer's hand-off of one finished request (OutputStreamer.accept)
    recv = NS(
        input_token_logprobs_val=[lg.input_token_logprobs_val],
        input_token_logprobs_idx=[lg.input_token_logprobs_idx],
        input_top_logprobs_val=[lg.input_top_logprobs_val],
        input_top_logprobs_idx=[lg.input_top_logprobs_idx],
        input_top_logprobs_val_flat=[None],
        input_token_ids_logprobs_val=[lg.input_token_ids_logprobs_val],
        input_token_ids_logprobs_idx=[lg.input_token_ids_logprobs_idx],
        output_token_logprobs_val=[lg.output_token_logprobs_val[:1]],
        output_token_logprobs_idx=[lg.output_token_logprobs_idx[:1]],
        output_top_logprobs_val=[lg.output_top_logprobs_val[:1]],
        output_top_logprobs_idx=[lg.output_top_logprobs_idx[:1]],
        output_token_ids_logprobs_val=[lg.output_token_ids_logprobs_val[:1]],
        output_token_ids_logprobs_idx=[lg.output_token_ids_logprobs_idx[:1]],
    )
    obj = NS(
        top_logprobs_num=top_k,
        token_ids_logprob=token_ids,
        return_flat_raw_top_logprobs=False,
        return_flat_raw_output_top_logprobs=False,
        return_flat_raw_top_logprobs_b64=False,
    )
    state = sgl.ReqState(out_list=[], finished=True, event=None, obj=obj, time_stats=None)
    # mirror: the literal base meta_info of TokenizerManager._handle_batch_output
    meta = {
        "id": "req",
        "finish_reason": sgl.FINISH_LENGTH(length=1).to_json(),
        "prompt_tokens": len(input_ids),
        "weight_version": "default",
        "num_retractions": 0,
    }
    manager = object.__new__(sgl.TokenizerManager)
    manager.tokenizer = None
    manager.convert_logprob_style(meta, state, top_k, token_ids, False, recv, 0, finished=True)
    meta.update(reasoning_tokens=0, completion_tokens=1, cached_tokens=prefix)
    return json.loads(json.dumps({"text": "", "output_ids": [nxt], "meta_info": meta}))  # tuples become arrays


def _truth(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)


def test_a_scoring_response_with_a_draft_at_vocab_size_minus_one(sgl, tiny_backend):
    model = tiny_backend.verifier
    prefix, drafts, asked = [5, 9, 7, 12, 30], [3, 63, 8], [63, 40, 3]
    ids = prefix + drafts
    body = sglang_generate(sgl, model, ids, len(prefix) - 1, 4, asked, radix_match=0)
    meta = body["meta_info"]
    assert meta["input_token_logprobs"][2][1] == 0 and meta["input_token_logprobs"][0][0] is None  # the rewrite
    assert meta["input_top_logprobs"][0] is None and meta["input_token_ids_logprobs"][0] is None
    assert all(e[2] is None for e in meta["input_top_logprobs"][1] + meta["output_top_logprobs"][0])  # null text
    rows, missing, cached = parse_score(body, drafts, 64, asked=True)
    truth = _truth(model, ids)[len(prefix) - 1 :]
    for j, row in enumerate(rows):
        known = torch.isfinite(row)
        expected = set(truth[j].topk(4).indices.tolist()) | set(asked) | ({drafts[j]} if j < 3 else set())
        assert set(known.nonzero().squeeze(-1).tolist()) == expected
        assert torch.allclose(row[known], truth[j][known], atol=1e-6)
        assert missing[j] == pytest.approx(1 - float(truth[j][known].double().exp().sum()), abs=1e-6)
    assert cached == 0


def test_a_prefix_cache_hit_is_capped_at_logprob_start_len(sgl, tiny_backend):
    model = tiny_backend.verifier
    prefix = [5, 9, 7, 12, 30, 2]
    earlier, now = prefix + [3, 4, 8], prefix + [3, 11, 1]  # the radix tree holds prefix + [3]
    body = sglang_generate(sgl, model, now, len(prefix) - 1, 64, [11], radix_match=len(prefix) + 1)
    assert body["meta_info"]["cached_tokens"] == len(prefix) - 1  # capped: every draft still gets its logprob
    rows, _, cached = parse_score(body, [3, 11, 1], 64, asked=True)
    assert cached == len(prefix) - 1 and torch.allclose(rows, _truth(model, now)[len(prefix) - 1 :], atol=1e-6)
    # the stand-in answers the same two requests with the same bodies (ids aside)
    server = StandInServer(model)
    for ids in (earlier, now):
        payload = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": len(prefix) - 1,
            "top_logprobs_num": 64,
            "token_ids_logprob": [11],
        }
        standin = json.loads(json.dumps(server.answer(payload)))
    body["meta_info"].pop("id"), standin["meta_info"].pop("id")
    assert standin == body


@pytest.mark.parametrize("asked", [None, [2, 63]])
def test_the_stand_in_answers_like_sglang(sgl, tiny_backend, asked):
    model = tiny_backend.verifier
    ids = [1, 63, 7, 63, 4]  # V - 1 in the prompt, at the boundary and as a draft
    body = sglang_generate(sgl, model, ids, 1, 5, asked, radix_match=0)
    payload = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 1,
        "top_logprobs_num": 5,
        **({"token_ids_logprob": asked} if asked else {}),
    }
    standin = json.loads(json.dumps(StandInServer(model).answer(payload)))
    body["meta_info"].pop("id"), standin["meta_info"].pop("id")
    assert standin == body
    assert ("input_token_ids_logprobs" in body["meta_info"]) == bool(asked)  # absent unless asked
    rows, _, _ = parse_score(body, ids[2:], 64, asked=bool(asked))
    assert rows.shape == (4, 64)


def test_an_ar_step_has_only_the_boundary_and_the_bonus_row(sgl, tiny_backend):
    model = tiny_backend.verifier
    ids = [5, 9, 7]
    body = sglang_generate(sgl, model, ids, len(ids) - 1, 8, None, radix_match=0)
    assert len(body["meta_info"]["input_token_logprobs"]) == 1
    rows, _, _ = parse_score(body, [], 64)
    row, _ = parse_next(body, 64)
    assert torch.equal(rows[0], row)
    known = torch.isfinite(row)
    assert int(known.sum()) == 8 and torch.allclose(row[known], _truth(model, ids)[-1][known], atol=1e-6)


@pytest.mark.parametrize("verify_ct, correct, completion", [(0, 0, 1), (3, 5, 9)])
def test_speculative_counters_as_sglang_writes_them(sgl, verify_ct, correct, completion):
    recv = NS(
        spec_verify_ct=[verify_ct],
        spec_num_correct_drafts=[correct],
        completion_tokens=[completion],
        spec_correct_drafts_histogram=[[1, 1, 0, 1, 0]],
        spec_num_cap_tokens=None,
        spec_num_block_accept_tokens=None,
        spec_cap_lens_histogram=None,
    )
    meta = {"completion_tokens": completion, "finish_reason": sgl.FINISH_MATCHED_TOKEN(matched=2).to_json()}
    manager = object.__new__(sgl.TokenizerManager)
    manager._calculate_spec_decoding_metrics(meta, recv, 0)
    tel = parse_spec_telemetry(json.loads(json.dumps(meta)), n_draft=SPEC.speculative_num_draft_tokens - 1)
    if verify_ct == 0:
        assert not any(k.startswith("spec_") for k in meta)  # no verify round: no spec_* key at all
        assert (tel.rounds, tel.accepted, tel.proposed) == (0, 0, 0)
    else:
        assert (tel.rounds, tel.accepted, tel.proposed) == (3, 5, 12)
        assert tel.keys == ("spec_num_correct_drafts", "spec_num_proposed_drafts")


# ------------------------------------------------------------------ /server_info


@pytest.fixture
def sglang_server_info():
    """SGLang 0.5.23's ``/server_info`` and ``/set_internal_state`` over a
    scheduler launched with ``flags`` (one data-parallel rank)."""
    runtime = load("sglang/srt/runtime_context.py", {"RuntimeContext": ["resolved_server_args_dict"]}, dict(COMMON))
    context = object.__new__(runtime["RuntimeContext"])
    stubs = {
        **COMMON,
        "get_context": lambda: context,
        "get_exec": lambda: NS(moe=NS(elastic_ep_backend=None)),
        "get_parallel": lambda: NS(dp_size=1, tp_size=1, pp_size=1),
        "compute_world_size": lambda **kw: 1,
        "build_memory_usage": lambda **kw: {},
        "msgspec_to_builtins": lambda x: x,
        "exportable_env_vars": dict,
        "envs": NS(SGLANG_EXPOSE_OWN_ENV_VARS=NS(get=lambda: False)),
        "Callable": typing.Callable,
        "GetInternalStateReqOutput": lambda internal_state: NS(internal_state=internal_state),
        "SetInternalStateReqOutput": lambda updated: NS(updated=updated),
    }
    state = load(
        "sglang/srt/managers/scheduler_components/internal_state.py",
        {
            "_DECODE_GRAPH_PHASES": None,
            "UpdateRejected": None,
            "SchedulerInternalStateController": None,
            "_UpdateHandler": None,
            "_override": None,
        },
        stubs,
    )
    scheduler = NS(
        spec_algorithm=NS(is_none=lambda: False, is_dspark=lambda: False, is_dflash=lambda: False),
        metrics_reporter=NS(last_gen_throughput=0.0, spec_total_num_accept_tokens=30, spec_total_num_forward_ct=10),
        startup_time=0.0,
        max_running_requests=8,
        draft_worker=None,
        rust_server=None,
        tp_worker=NS(model_runner=NS(weight_load_mem_usage=1.0), graph_memory_usage=0.0),
        token_to_kv_pool_allocator=NS(get_kvcache=lambda: NS(mem_usage=1.0)),
        startup_available_gpu_memory_gb=10.0,
        max_total_num_tokens=1000,
        swa_tokens_per_layer=None,
    )
    controller = state["SchedulerInternalStateController"](scheduler, record_step_time=False)

    async def get_internal_state():  # TokenizerControlMixin.get_internal_state: one answer per rank
        return [controller.get_internal_state(None).internal_state]

    def start(flags: dict):
        context.server_args = NS(resolved_dict=lambda: dict(flags))
        context._overrides_log = []  # what RuntimeContext.override records (and resolved_server_args_dict reads)
        context.override = lambda source, **fields: context._overrides_log.append((source, dict(fields)))
        http = load(
            "sglang/srt/entrypoints/http_server.py",
            {"server_info": None},
            {
                **COMMON,
                "__version__": "0.5.23",
                "msgspec_to_builtins": lambda x: x,
                "redact_watermark_secrets": lambda x: x,
                "build_server_info": lambda server_args, scheduler_info: dict(flags),
                "_global_state": NS(
                    tokenizer_manager=NS(get_internal_state=get_internal_state, server_args=None, startup_time=0.0),
                    scheduler_info={},
                ),
            },
        )
        info = lambda: json.loads(json.dumps(asyncio.run(http["server_info"]())))  # noqa: E731
        update = lambda **values: controller.set_internal_state(NS(server_args=values)).updated  # noqa: E731
        return info, update

    return start


LAUNCH = {
    "speculative_algorithm": "STANDALONE",
    "speculative_eagle_topk": 1,
    "speculative_num_steps": 4,
    "speculative_num_draft_tokens": 5,
    "speculative_accept_threshold_single": 0.5,
    "speculative_accept_threshold_acc": 0.5,
    "enable_deterministic_inference": True,
}


def test_live_thresholds_come_from_internal_states(sglang_server_info):
    info, update = sglang_server_info(LAUNCH)
    before = info()
    assert parse_point(before) == (0.5, 4) and before["internal_states"][0]["avg_spec_accept_length"] == 3.0
    assert update(speculative_accept_threshold_single=0.3, speculative_accept_threshold_acc=0.3)
    now = info()
    assert now["speculative_accept_threshold_acc"] == 0.5  # the top level keeps the launch flag
    assert "avg_spec_accept_length" not in now["internal_states"][0]  # the server-wide average restarts
    assert parse_point(now) == (0.3, 4)  # the live value
    assert not update(speculative_num_steps=2)  # N cannot change at run time
    assert update(speculative_accept_threshold_single=0.9)
    with pytest.raises(SGLangError, match="threshold_single 0.9 != threshold_acc 0.3"):
        parse_point(info())


def test_a_server_without_deterministic_inference_is_refused(sglang_server_info):
    info, _ = sglang_server_info({**LAUNCH, "enable_deterministic_inference": False})
    with pytest.raises(SGLangError, match="ignores sampling_seed .*--enable-deterministic-inference"):
        parse_point(info())


def test_a_missing_draft_logprob_is_an_error_not_a_guess(sgl, tiny_backend):
    body = sglang_generate(sgl, tiny_backend.verifier, [5, 9, 7, 3, 4], 2, 4, None, radix_match=0)
    body["meta_info"]["input_token_logprobs"][1][0] = None
    with pytest.raises(SGLangError, match=r"input_token_logprobs\[1\] has no logprob for draft 3"):
        parse_score(body, [3, 4], 64)
