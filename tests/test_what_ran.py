"""The tuned config names what ran: the runtime, and each model's weight format (a GGUF's
quantisation type read from the file's own metadata; transformers' dtype; an SGLang
server's own dtype), with ``dtype`` only where it applies."""

import pytest

from relaxtune.backends.gguf_info import embedded_gguf, gguf_quant_type
from relaxtune.backends.sglang_costs import served_dtype
from relaxtune.report.decision import decide
from relaxtune.report.deploy import weights
from relaxtune.report.export import what_ran
from relaxtune.testing.sglang_standin import StandInServer
from relaxtune.tune.tuning import TuneSettings

from .test_deploy_export import tune
from .tiny_gguf import write_tiny_gguf
from .tiny_models import VOCAB, tiny_lm

pytest.importorskip("llama_cpp")


def test_a_gguf_is_named_by_the_type_in_its_metadata(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", vocab=VOCAB, control=3, eos=0)  # general.file_type ALL_F32
    assert gguf_quant_type(str(path)) == "F32"
    assert weights(str(path), None, "llamacpp") == {"model": str(path), "format": "GGUF F32", "runtime": "llamacpp"}
    missing = str(tmp_path / "none.gguf")
    assert weights(missing, None, "llamacpp")["format"] == f"GGUF (type not read: no GGUF file {missing})"
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        gguf_quant_type(missing)


def test_the_embedded_ggufs_are_q4_k_m_by_their_own_metadata():
    path = embedded_gguf("qwen2.5-coder-1.5b-instruct")
    if path is None:
        pytest.skip("the embedded verifier's GGUF is not assembled in this cache")
    assert gguf_quant_type(str(path)) == "Q4_K_M"
    w = weights("qwen2.5-coder-1.5b-instruct", None, "llamacpp")
    assert (w["format"], w["runtime"], w["upstream"]) == ("GGUF Q4_K_M", "llamacpp", "Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert weights("qwen2.5-coder-1.5b-instruct", "float32", "hf")["format"] == "GGUF Q4_K_M dequantised to float32"


def test_a_llamacpp_jobs_config_has_no_dtype_and_names_the_gguf_type(tmp_path):
    _, config = tune(tmp_path, 0.9, runtime="llamacpp", cliff=-1.0, drop=0.25, strict_accept=0.05)
    assert (config.runtime, config.dtype) == ("llamacpp", None)
    assert config.weights["drafter"]["format"] == config.weights["verifier"]["format"] == "GGUF Q4_K_M"
    assert config.recommendation.deploy["vllm"]["weights"]["verifier"]["format"] == "GGUF Q4_K_M"
    params = decide(config).params
    assert (params["runtime"], params["dtype"], params["verifier_weights"]) == ("llamacpp", "-", "GGUF Q4_K_M")


def test_an_sglang_job_records_the_servers_dtype():
    server = StandInServer(tiny_lm()).start()  # float32, reported as ServerArgs.dtype in /server_info
    try:
        assert served_dtype(server.url) == "float32"
        s = TuneSettings(task="gsm8k_mini", drafter_url=server.url, verifier_url=server.url)
        assert what_ran(s.pair) == ("sglang", "float32")
        assert weights("standin-model", "float32", "sglang")["format"] == "as served by SGLang (float32)"
    finally:
        server.stop()
    assert served_dtype("http://127.0.0.1:9") == "as served"  # nothing answers there
    assert what_ran(TuneSettings(task="gsm8k_mini", runtime="hf", dtype="float16").pair) == ("hf", "float16")
