"""report/deploy.py: exact deploy blocks per engine, and each engine's refusals."""

import json

import pytest

from relaxtune.report.deploy import (
    deploy_blocks,
    engines_running,
    plain_blocks,
    weights,
)

S = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
G = {"temperature": 0.0, "top_p": 1.0, "top_k": None}
W = {
    "drafter": {"model": "d", "format": "float32", "runtime": "hf"},
    "verifier": {"model": "v", "format": "float32", "runtime": "hf"},
}


def blocks(method, knob, n, sampling=S):
    return deploy_blocks(method, knob, n, sampling, "d", "v", "float32", "hf")


def test_fly_vllm_block_exact():
    out = blocks("fly", 0.5, 4)
    assert list(out) == ["vllm"]
    b = out["vllm"]
    assert b["engine"] == "vLLM 0.33.0" and b["weights"] == W and b["sampling"] == S
    assert b["launch_args"][:4] == ["vllm", "serve", "v", "--speculative-config"]
    assert json.loads(b["launch_args"][4]) == {
        "method": "draft_model",
        "model": "d",
        "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic",
        "rejection_sample_method": "fly",
        "fly_window_size": 3,
        "fly_entropy_threshold": 0.5,
        "fly_entropy_top_k": 3,
    }
    assert b["request_sampling"] == S


def test_fly_named_knobs_and_refusals():
    cfg = json.loads(
        blocks("fly", {"fly_window_size": 2, "fly_entropy_threshold": 0.9, "fly_entropy_top_k": 5}, 8)["vllm"][
            "launch_args"
        ][4]
    )
    assert (cfg["fly_window_size"], cfg["fly_entropy_threshold"], cfg["fly_entropy_top_k"]) == (2, 0.9, 5)
    assert blocks("fly", 0.5, 1) == {
        "vllm": {
            "engine": "vLLM 0.33.0",
            "refused": (
                "FLy needs num_speculative_tokens >= 2 (vLLM 0.33.0 vllm/config/speculative.py:2014-2033); "
                "this point has N=1"
            ),
        }
    }
    refused = blocks("fly", {"fly_window_size": 4, "fly_entropy_threshold": 0.3, "fly_entropy_top_k": 3}, 4)
    assert refused["vllm"]["refused"] == (
        "FLy needs fly_window_size < num_speculative_tokens (vLLM 0.33.0 "
        "vllm/config/speculative.py:2014-2033); this point has fly_window_size=4, N=4"
    )


def test_sglang_block_exact_and_refusals():
    b = blocks("sglang_threshold", 0.5, 3)["sglang"]
    assert b["launch_args"] == [
        "--model-path",
        "v",
        "--speculative-draft-model-path",
        "d",
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-steps",
        "3",
        "--speculative-num-draft-tokens",
        "4",
        "--speculative-accept-threshold-single",
        "0.5",
        "--speculative-accept-threshold-acc",
        "0.5",
    ]
    assert b["set_internal_state"] == {
        "server_args": {"speculative_accept_threshold_single": 0.5, "speculative_accept_threshold_acc": 0.5}
    }
    assert b["engine"] == "SGLang 0.5.23" and b["weights"] == W and b["sampling"] == S
    two = blocks(
        "sglang_threshold", {"speculative_accept_threshold_single": 0.9, "speculative_accept_threshold_acc": 0.4}, 3
    )["sglang"]
    assert two["launch_args"][-4:] == [
        "--speculative-accept-threshold-single",
        "0.9",
        "--speculative-accept-threshold-acc",
        "0.4",
    ]
    greedy = blocks("sglang_threshold", 0.5, 3, G)["sglang"]
    assert set(greedy) == {"engine", "refused"} and "non-greedy rows only" in greedy["refused"]
    assert "eagle_utils.py:485-500" in greedy["refused"]
    with pytest.raises(ValueError, match="outside the valid range"):
        blocks("sglang_threshold", 1.5, 3)


def test_trtllm_block_exact_and_refusal():
    b = blocks("trtllm_relaxed", {"relaxed_topk": 10, "relaxed_delta": 0.6}, 3, G)["trtllm"]
    assert b["speculative_config"] == {
        "decoding_type": "MTP",
        "num_nextn_predict_layers": 3,
        "use_relaxed_acceptance_for_thinking": True,
        "relaxed_topk": 10,
        "relaxed_delta": 0.6,
    }
    assert b["request_sampling"] == {"temperature": 0.0}
    assert "separate drafter (d), not MTP heads" in b["note"]
    r = blocks("trtllm_relaxed", 0.6, 3)["trtllm"]
    assert r["refused"].startswith("TensorRT-LLM's relaxed acceptance is greedy-only")
    assert r["refused"].endswith("measured at temperature 0.6")


def test_transformers_block_exact():
    b = blocks("ens", 0.2, 4)["transformers"]
    assert b["generate_kwargs"] == {
        "assistant_model": "d",
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "assistant_ensemble_weight": 0.8,
    }
    assert b["assistant_generation_config"] == {
        "num_assistant_tokens": 4,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    assert b["engine"] == "transformers 5.14.0" and b["weights"] == W
    assert "greedy path takes the argmax of the mixture" in blocks("ens", 0.2, 4, G)["transformers"]["refused"]


def test_strict_points_every_engine_lossless():
    for method, knob in (("strict", None), ("ens", 0.0), ("fly", float("inf")), ("sglang_threshold", 1.0)):
        out = blocks(method, knob, 4)
        assert list(out) == ["vllm", "sglang", "trtllm", "transformers"], method
        assert json.loads(out["vllm"]["launch_args"][4])["rejection_sample_method"] == "standard"
        assert not any("threshold" in a for a in out["sglang"]["launch_args"])
        assert "assistant_ensemble_weight" not in out["transformers"]["generate_kwargs"]
        assert out["trtllm"]["speculative_config"] == {
            "decoding_type": "Draft_Target",
            "max_draft_len": 4,
            "speculative_model": "d",
        }


def test_unshipped_rule_one_line():
    assert blocks("cactus", 0.25, 4) == "no engine ships cactus; only relaxtune's own verify loop runs it"
    line = blocks("typical", 0.09, 4)
    assert isinstance(line, str) and line.startswith("no engine ships typical (vLLM's TypicalAcceptanceSampler")
    assert engines_running("mentored") == () and engines_running("fly") == ("vllm",)


def test_weights_name_the_measured_files():
    w = weights("qwen2.5-coder-0.5b-instruct", "bfloat16", "llamacpp")
    assert w["format"] == "GGUF Q4_K_M" and w["runtime"] == "llamacpp"
    assert "re-quantisation of an AWQ variant" in w["note"] and w["sha256"].startswith("1d9614")
    assert weights("qwen2.5-coder-1.5b-instruct", "bfloat16", "hf")["format"] == "GGUF Q4_K_M dequantised to bfloat16"
    assert weights("org/m", "float16", "hf") == {"model": "org/m", "format": "float16", "runtime": "hf"}


def test_plain_blocks_have_no_speculative_args():
    out = plain_blocks("v", S, "float32", "hf", reason="strict models 0.70x")
    assert out["vllm"]["launch_args"] == ["vllm", "serve", "v"]
    assert out["sglang"]["launch_args"] == ["--model-path", "v"]
    assert out["transformers"]["generate_kwargs"] == {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    for b in out.values():
        assert b["decoding"] == "plain" and "(strict models 0.70x)" in b["note"]
        assert not any("specul" in a for a in b.get("launch_args", []))
