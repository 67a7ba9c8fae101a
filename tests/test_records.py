"""Typed records and point metrics, schema v3, and the v2 loader (relaxtune.tune.records).

The golden run (``tests/v2_run.py``: a tiny float32 pair, fixed seeds) is run again on
this code and compared with what main 6bddc2b wrote (``tests/fixtures/v2_run``): its records
JSONL, Optuna user attributes and tuned YAML are identical but for the v3 fields, the
timings and the code identities. The v2 run itself loads, re-exports and resumes."""

import json
import shutil
from pathlib import Path

import optuna
import pytest
import yaml

from relaxtune.report.config_schema import upgrade_config
from relaxtune.report.export import load_config
from relaxtune.tune import evaluation, point_records
from relaxtune.tune.point_records import DecodeConfig, finished_records
from relaxtune.tune.records import (
    PointMetrics,
    RecordError,
    SampleRecord,
    knob_of,
    knobs_of,
    load_metrics,
    load_record,
    metrics_attr,
    point_values,
    trial_metrics,
)

from . import v2_run

V2 = Path(__file__).parent / "fixtures" / "v2_run"
RUNS = "relaxtune-runs"
V3_METRICS = ("schema", "knobs", "scope", "batch_size")


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    return v2_run.golden_backend(tmp_path_factory.mktemp("models"))


@pytest.fixture()
def v2_copy(tmp_path, monkeypatch):
    """The v2 run copied into a fresh folder, with this code's identity that of the code that wrote it
    (the decoding core's source may have changed since: the records would then be generated again)."""
    shutil.copytree(V2, tmp_path / "run")
    rec = json.loads(
        (tmp_path / "run" / RUNS / "golden-v1" / "golden-pair" / "strict__N2__seed0.jsonl").read_text().splitlines()[0]
    )
    written = {"grader": rec["grader"], "decoder": rec["decoder"]}
    monkeypatch.setattr(point_records, "record_identity", lambda: written)  # as records are read
    monkeypatch.setattr(evaluation, "record_identity", lambda: written)  # as new ones are written
    monkeypatch.chdir(tmp_path)
    return tmp_path / "run"


def test_v2_records_load_typed_and_dump_back_byte_for_byte():
    for path in (V2 / RUNS).rglob("*.jsonl"):
        lines = path.read_text().splitlines()
        done = finished_records(path)
        assert len(done) == len(lines) == 6
        for line in lines:
            rec = done[(json.loads(line)["problem_id"], 0)]
            assert isinstance(rec, SampleRecord) and rec.schema_ == 2 and rec.scope == "all"
            assert rec.knobs == ({} if rec.method == "strict" else {"delta": rec.knob})
            assert rec.stats["rounds"] == json.loads(line)["stats"]["rounds"] >= 1
            assert rec.response_tokens == json.loads(line)["response_tokens"] >= 1
            assert json.dumps(rec.dump()) == line  # nothing of v3 is added to a v2 record


def test_a_file_with_v2_and_v3_lines_reads_both(tmp_path):
    src = V2 / RUNS / "golden-v1" / "golden-pair" / "cactus-1__N2__seed0.jsonl"
    path = tmp_path / "mixed.jsonl"
    lines = src.read_text().splitlines()
    v3 = SampleRecord.new(**(json.loads(lines[0]) | {"problem_id": "extra"}))
    path.write_text("\n".join(lines) + "\n" + v3.line() + '{"problem_id": "cut", "rep')
    done = finished_records(path)
    assert sorted(k for k, _ in done) == ["0", "1", "2", "3", "4", "5", "extra"]  # the cut line waits
    assert done[("extra", 0)].schema_ == 3 and done[("extra", 0)].knobs == {"delta": 1.0}
    assert list(json.loads(v3.line()))[:1] == ["schema"] and json.loads(v3.line())["scope"] == "all"


def test_records_are_validated_where_they_cross_the_file():
    good = json.loads((V2 / RUNS / "golden-v1" / "golden-pair" / "strict__N2__seed0.jsonl").read_text().splitlines()[0])
    with pytest.raises(RecordError, match="not a sample record"):
        load_record(good | {"surprise": 1})
    with pytest.raises(RecordError, match="stats.rounds"):
        load_record(good | {"stats": {"rounds": "3", "accepted": 1}})
    with pytest.raises(RecordError, match="schema 4"):
        load_record(good | {"schema": 4})
    with pytest.raises(RecordError, match="scope"):
        load_record(good | {"schema": 3, "scope": "answers"})


def test_a_record_that_does_not_validate_is_generated_again(tmp_path, caplog):
    src = (V2 / RUNS / "golden-v1" / "golden-pair" / "strict__N2__seed0.jsonl").read_text().splitlines()
    bad = json.loads(src[1]) | {"correct": "maybe"}
    path = tmp_path / "r.jsonl"
    path.write_text(src[0] + "\n" + json.dumps(bad) + "\n")
    assert list(finished_records(path)) == [("0", 0)]
    assert "generating that sample again" in caplog.text


def test_knobs_map_the_single_knob_and_back():
    assert knobs_of("cactus", 10) == {"delta": 10.0} and knobs_of("strict", None) == {}
    assert knobs_of("gone-method", 0.5) == {"knob": 0.5}
    assert knob_of({"delta": 2.0}) == 2.0 and knob_of({}) is None
    with pytest.raises(RecordError, match="several knobs"):
        knob_of({"speculative_accept_threshold_single": 0.9, "speculative_accept_threshold_acc": 0.5})
    assert DecodeConfig("cactus", 1.0, 2).knobs == {"delta": 1.0}
    assert DecodeConfig("cactus", 1.0, 2).label == "cactus-1__N2__seed0"  # v2 file names
    assert DecodeConfig("cactus", 1.0, 2, scope="thinking").label == "cactus-1__N2__seed0__thinking"


def test_point_metrics_v2_and_v3(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    shutil.copy(V2 / RUNS / "optuna.db", tmp_path / "optuna.db")
    name = optuna.get_all_study_summaries(url, include_best_trial=False)[0].study_name
    trial = optuna.load_study(study_name=name, storage=url).trials[0]
    m = trial_metrics(trial, "cactus")
    assert isinstance(m, PointMetrics) and m.schema_ == 2 and m.knobs == {"delta": trial.params["knob"]}
    assert (m.scope, m.batch_size, m.n, m.strict_only + m.relaxed_only) == ("all", 1, 6, 0)
    assert m.speedup_by_c_rel.keys() == {"0.05", "0.2", "0.5"} and m.speedup_by_c_rel["0.2"] == m.speedup
    raw = trial.user_attrs["metrics"]
    assert json.dumps(m.dump()) == json.dumps(raw)  # a v2 attribute dumps back as it was stored
    v3 = metrics_attr(raw, "cactus", 10.0)
    assert list(v3)[:4] == list(V3_METRICS) and list(v3)[4:] == list(raw)
    assert load_metrics(v3).knobs == {"delta": 10.0} and load_metrics(v3).dump() == v3
    with pytest.raises(RecordError, match="not a point's metrics"):
        metrics_attr({k: v for k, v in raw.items() if k != "drop_ucb"}, "cactus", 10.0)
    with pytest.raises(RecordError, match="unknown point metric"):
        metrics_attr(raw | {"mystery": 1.0}, "cactus", 10.0)


def test_a_v2_tuned_config_loads_as_v3():
    data = yaml.safe_load((V2 / RUNS / "golden.tuned.yaml").read_text())
    config = load_config(V2 / RUNS / "golden.tuned.yaml")
    assert config.schema_version == 3 and config.serving_batch_sizes == [1]
    assert config.methods["cactus"].knobs == {"delta": 10.0} and config.methods["cactus"].scope == "all"
    assert (config.recommendation.knobs, config.recommendation.scope, config.recommendation.batch_size) == (
        {},
        "all",
        1,
    )
    assert config.model_dump(exclude={"schema_version", "serving_batch_sizes", "methods", "recommendation"}) == {
        k: v
        for k, v in load_config(V2 / RUNS / "golden.tuned.yaml").model_dump().items()
        if k not in ("schema_version", "serving_batch_sizes", "methods", "recommendation")
    }
    assert upgrade_config(upgrade_config(data)) == upgrade_config(data)
    with pytest.raises(ValueError, match="schema_version 1"):
        upgrade_config(data | {"schema_version": 1})


def test_a_v2_run_reexports(v2_copy, backend):
    config, path = v2_run.run(v2_copy, backend, new_trials=False, epsilon=0.55)
    assert path.name == "golden.tuned.eps0.55.yaml" and config.schema_version == 3
    loaded = load_config(path)
    assert loaded.methods["cactus"].knobs == {"delta": 10.0} and loaded.methods["cactus"].n_draft == 2
    before = load_config(V2 / RUNS / "golden.tuned.yaml")
    assert loaded.methods["cactus"].modeled_speedup == before.methods["cactus"].modeled_speedup
    assert loaded.recommendation.method == before.recommendation.method == "strict"


def test_a_v2_run_resumes_appending_v3(v2_copy, backend):
    files = {p: p.read_bytes() for p in (v2_copy / RUNS).rglob("*.jsonl")}
    v2_run.run(v2_copy, backend)  # the same job: every trial and sample is there, nothing is generated
    assert {p: p.read_bytes() for p in (v2_copy / RUNS).rglob("*.jsonl")} == files
    config, _ = v2_run.run(v2_copy, backend, trials=3)  # one more trial, next to the v2 ones
    assert config.methods["cactus"].trials == 3
    for p, data in files.items():
        assert p.read_bytes().startswith(data)  # v2 lines stay as they were
    new = [
        json.loads(x)
        for p in (v2_copy / RUNS).rglob("*.jsonl")
        for x in p.read_text().splitlines()
        if p not in files or len(x) and x.encode() not in files[p]
    ]
    assert new and all(list(r)[:1] == ["schema"] and r["schema"] == 3 and r["scope"] == "all" for r in new)
    assert all(r["knobs"] == ({} if r["knob"] is None else {"delta": r["knob"]}) for r in new)  # cactus's knob
    study = optuna.load_study(
        study_name=config.methods["cactus"].study_name, storage=f"sqlite:///{v2_copy / RUNS / 'optuna.db'}"
    )
    schemas = sorted(trial_metrics(t, "cactus").schema_ for t in study.trials)
    assert schemas == [2, 2, 3]


def test_a_tracker_logs_the_same_values_from_v2_and_v3_metrics():
    url = f"sqlite:///{V2 / RUNS / 'optuna.db'}"
    name = optuna.get_all_study_summaries(url, include_best_trial=False)[0].study_name
    raw = optuna.load_study(study_name=name, storage=url).trials[0].user_attrs["metrics"]
    assert point_values(metrics_attr(raw, "cactus", 10.0)) == point_values(raw) == raw
    assert point_values(None) == {}


def test_judge_reads_an_evaluations_records_typed_and_names_one_that_does_not_validate():
    from relaxtune.tune.judge import typed_records
    from relaxtune.tune.point_records import summarize

    stats = {"rounds": 2, "accepted": 3, "wall_seconds": 0.5}
    good = {"problem_id": "p0", "repeat": 1, "response_tokens": 5, "correct": True, "finish_reason": "stop"}
    typed = typed_records(summarize([good | {"stats": stats}], Path("runs/x.jsonl")))
    assert [(r.key, r.response_tokens, r.correct, r.stats["accepted"]) for r in typed] == [(("p0", 1), 5, True, 3)]
    bad = good | {"problem_id": "p1", "stats": stats, "colour": "red"}  # a field no schema has
    with pytest.raises(RecordError, match=r"runs/x\.jsonl record 1: not a sample record"):
        typed_records(summarize([good | {"stats": stats}, bad], Path("runs/x.jsonl")))
