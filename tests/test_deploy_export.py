"""The tuned config's deploy blocks and its plain-decoding recommendation (synthetic
objective, Optuna on sqlite, no models)."""

import json

import pytest
import yaml

from relaxtune.report.config_schema import Recommendation
from relaxtune.report.decision import decide
from relaxtune.report.export import build_config, cautions, load_config, save_config
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
    point = {"method": "strict", "knob": None, "n_draft": 4, "modeled_speedup": 0.7, "reason": "use strict: x"}
    out = plain_if_nothing_pays(point | {"batch_size": 1}, {4: {"modeled_speedup": 0.7}}, {})
    assert out == {
        "method": "plain",
        "knob": None,
        "knobs": {},
        "n_draft": None,
        "batch_size": 1,
        "modeled_speedup": 1.0,
        "speed_margin": None,
        "decoding": "plain",
        "fastest_speculative": point | {"speed_margin": None},
        "reason": "serve the verifier alone (plain decoding): no speculative point pays on the measured costs "
        "(strict's best models 0.70x, no relaxed point confirmed)",
    }
    out2 = plain_if_nothing_pays(point, {4: {"modeled_speedup": 0.7}}, {"cactus": R(True, 0.9)})
    assert out2["reason"].endswith("(strict's best models 0.70x, every confirmed relaxed point below 1x too)")
    paying = plain_if_nothing_pays(point, {4: {"modeled_speedup": 1.2}}, {})
    assert paying == point | {"decoding": "speculative"}  # the point itself, no fastest_speculative


def tune(tmp_path, c_rel, runtime="hf", **synthetic):
    settings = TuneSettings(
        task="synthetic",
        runtime=runtime,
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
    # verify is costly (c_rel 0.9) and strict accepts little: strict models 6/23 = 0.26x at N=4, no relaxed point
    tuner, config = tune(tmp_path, 0.9, cliff=-1.0, drop=0.25, strict_accept=0.05)
    rec = config.recommendation
    assert tuner.strict_speedup(4) == 6 / 23
    assert (rec.method, rec.decoding, rec.knob, rec.knobs, rec.n_draft) == ("plain", "plain", None, {}, None)
    assert (rec.modeled_speedup, rec.strict_modeled_speedup, rec.speed_margin) == (1.0, 6 / 23, None)
    assert rec.reason == (
        "serve the verifier alone (plain decoding): no speculative point pays on the measured costs (strict's best "
        "models 0.26x, no relaxed point confirmed)"
    )
    assert rec.fastest_speculative.model_dump() == {
        "method": "strict",
        "knob": None,
        "knobs": {},
        "scope": "all",
        "n_draft": 4,
        "modeled_speedup": 6 / 23,
        "speed_margin": None,
        "reason": "use strict: no relaxed point was confirmed within the capability-loss budget (epsilon 0.05, "
        "200 problems)",
    }
    assert set(rec.deploy) == {"vllm", "sglang", "trtllm", "transformers"}
    for block in rec.deploy.values():
        assert block["decoding"] == "plain"
        assert not any("specul" in a for a in block.get("launch_args", []))
        assert block["note"] == "serve the verifier alone: no speculative point pays on the measured costs"
    assert rec.deploy["vllm"]["launch_args"] == ["vllm", "serve", "Qwen/Qwen2.5-Coder-1.5B-Instruct"]
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
    assert (config.runtime, config.dtype) == ("hf", "bfloat16")
    assert config.weights["verifier"]["format"] == "GGUF Q4_K_M dequantised to bfloat16"
    assert config.weights["verifier"]["sha256"].startswith("cc324af0")
    assert load_config(save_config(config, tmp_path / "t.yaml")) == config
    assert cautions(config)[-1] == (
        "the fastest speculative point (strict at N=4) models 0.26x: slower than plain decoding on these costs "
        "(c_rel 0.900); the recommendation is plain decoding (serve the verifier alone); if the costs look wrong, "
        "check them (--remeasure-costs, --c-rel)"
    )


def test_a_plain_decision_names_plain_in_every_field(tmp_path):
    _, config = tune(tmp_path, 0.9, cliff=-1.0, drop=0.25, strict_accept=0.05)
    d = decide(config)
    assert d.label == "plain decoding (the verifier alone)"
    assert {k: d.params[k] for k in ("recommended_method", "recommended_knob", "recommended_n_draft")} == {
        "recommended_method": "plain",
        "recommended_knob": "-",
        "recommended_n_draft": "-",
    }
    assert {k: d.params[k] for k in ("runtime", "dtype", "verifier_weights")} == {
        "runtime": "hf",
        "dtype": "bfloat16",
        "verifier_weights": "GGUF Q4_K_M dequantised to bfloat16",
    }
    assert d.tags["relaxtune.recommended"] == "plain decoding (the verifier alone)"
    assert d.tags["relaxtune.recommended_method"] == "plain"
    assert d.tags["relaxtune.fastest_speculative"] == "strict N=4"
    assert (d.metrics["recommended_speedup"], d.metrics["fastest_speculative_speedup"]) == (1.0, 6 / 23)
    assert d.metrics["recommended_drop_ucb"] == 0.0
    assert d.description.startswith(
        "Use plain decoding (the verifier alone) on synthetic v2 (modeled 1.00x over AR, epsilon 0.05, 200 problems "
        "x 1): no speculative point pays on the measured costs (strict's best models 0.26x, no relaxed point "
        "confirmed); the closest tried point, cactus delta="
    )


def test_paying_strict_deploys_every_engines_lossless_config(tmp_path):
    # verify is cheap (c_rel 0.2): strict models exactly 1.00x at N=4, which pays (>= 1)
    _, config = tune(tmp_path, 0.2, cliff=-1.0, drop=0.25)
    rec = config.recommendation
    assert (rec.method, rec.decoding, rec.n_draft, rec.modeled_speedup) == ("strict", "speculative", 4, 1.0)
    assert rec.fastest_speculative is None
    assert decide(config).label == "strict N=4" and "relaxtune.fastest_speculative" not in decide(config).tags
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
    assert (
        "fastest speculative point (for information): strict N=4, modeled 0.26x: use strict: no relaxed point was "
        "confirmed" in out
    )
    assert "recommendation: strict" not in out


def test_a_plain_recommendation_written_before_method_plain_reads_as_today(tmp_path):
    _, config = tune(tmp_path, 0.9, cliff=-1.0, drop=0.25, strict_accept=0.05)
    data = config.model_dump(mode="json")
    rec = data["recommendation"]
    fast = rec.pop("fastest_speculative")
    data["recommendation"] = rec | {  # as main wrote it: the fastest point's fields, decoding plain
        "method": fast["method"],
        "n_draft": fast["n_draft"],
        "modeled_speedup": fast["modeled_speedup"],
        "reason": f"{rec['reason']}; for reference, {fast['reason']}",
    }
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data | {"runtime": "llamacpp", "dtype": "bfloat16"}))
    old = load_config(path)
    assert old.recommendation == config.recommendation
    assert (old.runtime, old.dtype) == ("llamacpp", None)  # a llama.cpp run's unused dtype dropped


def test_the_schema_refuses_a_half_plain_recommendation(tmp_path):
    _, config = tune(tmp_path, 0.9, cliff=-1.0, drop=0.25, strict_accept=0.05)
    rec = config.recommendation.model_dump()
    for bad in ({"n_draft": 4}, {"decoding": "speculative"}, {"knobs": {"alpha": 0.2}}):
        with pytest.raises(ValueError, match="recommendation: "):
            Recommendation(**(rec | bad))
    with pytest.raises(ValueError, match="recommendation: strict needs a draft length and no fastest_speculative"):
        Recommendation(**(rec | {"method": "strict", "decoding": "speculative", "n_draft": 4}))
