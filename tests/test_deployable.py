"""decoding/deployable.py: the methods and sampling each engine runs; the rest refused by name."""

import pytest

from relaxtune.decoding.deployable import deployable_methods

ALL = ["strict", "ens", "cactus", "fly", "sglang_threshold", "trtllm_relaxed", "typical"]


def test_each_engine_keeps_its_rules_at_its_sampling():
    assert deployable_methods(["vllm"], ALL, 0.6)[0] == ["strict", "fly"]
    assert deployable_methods(["vllm"], ALL, 0.0)[0] == ["strict", "fly"]
    assert deployable_methods(["sglang"], ALL, 0.6)[0] == ["strict", "sglang_threshold"]
    assert deployable_methods(["trtllm"], ALL, 0.0)[0] == ["strict", "trtllm_relaxed"]
    assert deployable_methods(["transformers"], ALL, 0.6)[0] == ["strict", "ens"]
    assert deployable_methods(["vllm", "transformers", "vllm"], ALL, 0.6)[0] == ["strict", "ens", "fly"]


def test_refusals_name_the_reason():
    kept, refused = deployable_methods(["sglang"], ALL, 0.0)
    assert kept == ["strict"]
    assert refused["sglang_threshold"] == (
        "sglang_threshold: SGLang applies its thresholds to non-greedy rows only; the task samples at temperature 0"
    )
    assert refused["cactus"] == "cactus: not run by sglang (runs on no engine)"
    assert refused["fly"] == "fly: not run by sglang (runs on vllm)"
    _, refused = deployable_methods(["trtllm"], ["trtllm_relaxed"], 0.6)
    assert refused == {
        "trtllm_relaxed": "trtllm_relaxed: TensorRT-LLM runs relaxed acceptance greedy only; the task "
        "samples at temperature 0.6"
    }
    _, refused = deployable_methods(["transformers"], ["ens"], 0.0)
    assert "greedy ensemble is another rule" in refused["ens"]


def test_unknown_engine_or_method():
    with pytest.raises(ValueError, match="unknown engine\\(s\\) llamacpp; use vllm, sglang, trtllm, transformers"):
        deployable_methods(["llamacpp"], ALL, 0.6)
    with pytest.raises(ValueError, match="unknown method"):
        deployable_methods(["vllm"], ["nope"], 0.6)
