"""The tuned config's deploy blocks and its plain-decoding recommendation (synthetic
objective, Optuna on sqlite, no models)."""

import json

from relaxtune.report.export import build_config, load_config, save_config
from relaxtune.tune.recommend import plain_if_nothing_pays, speculation_pays
from relaxtune.tune.tuning import Tuner, TuneSettings

from .synthetic import PROBLEMS, SPEC, Synthetic


class Pair:
    name = "synthetic-pair"


class R:  # a MethodResult's fields that the decision reads
    def __init__(self, feasible, speed):
        self.feasible, self.modeled_speedup = feasible, speed


def test_speculation_pays_reads_strict_and_confirmed_points():
    assert not speculation_pays({2: {"modeled_speedup": 0.7}, 4: {"modeled_speedup": 0.99}}, {"cactus": R(True, 0.9)})
    assert speculation_pays({4: {"modeled_speedup": 0.7}}, {"cactus": R(True, 1.2)})
    assert not speculation_pays({4: {"modeled_speedup": 0.7}}, {"cactus": R(False, None)})  # unconfirmed: ignored
    assert speculation_pays({4: {"modeled_speedup": 1.0}}, {})
    out = plain_if_nothing_pays(
        {"method": "strict", "modeled_speedup": 0.7, "reason": "use strict: x"}, {4: {"modeled_speedup": 0.7}}, {}
    )
    assert "(strict's best models 0.70x, no relaxed point confirmed)" in out["reason"]
    out2 = plain_if_nothing_pays(
        {"method": "strict", "modeled_speedup": 0.7, "reason": "use strict: x"},
        {4: {"modeled_speedup": 0.7}},
        {"cactus": R(True, 0.9)},
    )
    assert "(strict's best models 0.70x, every confirmed relaxed point below 1x too)" in out2["reason"]
    assert (
        out["decoding"] == "plain"
        and out["reason"].startswith(
            "serve the verifier alone (plain decoding): no speculative point pays on the measured costs (strict's best "
            "models 0.70x"
        )
        and out["reason"].endswith("for reference, use strict: x")
    )


def tune(tmp_path, c_rel, **synthetic):
    settings = TuneSettings(
        task="synthetic",
        methods=["cactus"],
        n_drafts=[4],
        trials=4,
        stage_size=50,
        output_dir=str(tmp_path),
        c_rel=c_rel,
    )
    tuner = Tuner(settings, SPEC, PROBLEMS, Pair(), c_rel, evaluate_fn=Synthetic(**synthetic), progress=False)
    return tuner, build_config(tuner.result([tuner.tune_method("cactus")]))


def test_nothing_pays_recommends_plain_decoding(tmp_path):
    tuner, config = tune(tmp_path, 0.9, cliff=-1.0, drop=0.25, strict_accept=0.05)
    rec = config.recommendation
    assert tuner.strict_speedup(4) < 1 and rec.decoding == "plain"
    assert "serve the verifier alone (plain decoding)" in rec.reason
    assert set(rec.deploy) == {"vllm", "sglang", "trtllm", "transformers"}
    for block in rec.deploy.values():
        assert block["decoding"] == "plain"
        assert not any("specul" in a for a in block.get("launch_args", []))
    assert rec.deploy["transformers"]["generate_kwargs"] == {
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
    }
    assert rec.serving == {
        "decoding": "plain",
        "note": "serve the verifier alone",
        "sglang_launch_args": ["--model-path", "Qwen/Qwen2.5-Coder-1.5B-Instruct"],
    }
    assert config.methods["cactus"].deploy is None  # no confirmed point
    assert config.runtime == tuner.settings.runtime
    assert config.weights["verifier"]["sha256"].startswith("cc324af0")
    assert load_config(save_config(config, tmp_path / "t.yaml")) == config


def test_paying_strict_deploys_every_engines_lossless_config(tmp_path):
    _, config = tune(tmp_path, 0.2, cliff=-1.0, drop=0.25)
    rec = config.recommendation
    assert rec.decoding == "speculative" and rec.method == "strict" and rec.modeled_speedup >= 1
    spec = json.loads(rec.deploy["vllm"]["launch_args"][4])
    assert spec["num_speculative_tokens"] == 4 and spec["rejection_sample_method"] == "standard"
    assert rec.deploy["transformers"]["assistant_generation_config"]["num_assistant_tokens"] == 4
    assert rec.deploy["sglang"]["launch_args"][-2:] == ["--speculative-num-draft-tokens", "5"]


def test_the_summary_recommends_plain_decoding_when_nothing_pays(tmp_path, capsys):
    from relaxtune.cli.tune import _summary

    _, config = tune(tmp_path, 0.9, cliff=-1.0, drop=0.25, strict_accept=0.05)
    _summary(config, tmp_path / "t.yaml")
    out = " ".join(capsys.readouterr().out.split())  # the console wraps at its width
    assert "recommendation: serve the verifier alone (plain decoding): no speculative point pays" in out
    assert "recommendation: strict" not in out
