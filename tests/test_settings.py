"""Settings declared once (issue 33) and bad inputs refused before any model loads (issue 38):
the nested model read and written under the flat names, every option and flow parameter made
from its fields, and each bad input a new user types refused with exit code 2, naming the
flag and the value, with no model loaded and no file written."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pydantic
import pytest
import yaml
from typer.testing import CliRunner

from relaxtune.cli import app
from relaxtune.tune.settings import GROUPS, TuneSettings, flat_fields, start, storage_url

runner = CliRunner()
WIDE = {"COLUMNS": "1000", "NO_COLOR": "1"}

# a job YAML as `relaxtune tune` saved it before the groups (every key, flat, in its order)
OLD_JOB = """\
task: humaneval
methods:
- cactus
drafter: qwen2.5-coder-0.5b-instruct
verifier: qwen2.5-coder-1.5b-instruct
dtype: float32
runtime: hf
drafter_url: null
verifier_url: null
tokenizer: null
native_url: null
concurrency: 4
batch_size: 2
epsilon: 0.1
confidence: 0.95
c_rel: 0.3
n_drafts:
- 4
- 10
trials: 6
limit: 20
seed: 3
stage_size: 5
output_dir: runs
storage: sqlite:///runs/optuna.db
mlflow_uri: sqlite:///mlflow.db
max_length_ratio: 1.5
max_truncated: 0.2
export: null
parallel_trials: 2
heartbeat: 10
grace_period: 60
range_size: 4
job_id: null
confirm: seeds
confirmations: 1
"""


# ------------------------------------------------------------------ the model


def test_a_flat_yaml_written_before_loads_and_dumps_back_byte_for_byte():
    flat = yaml.safe_load(OLD_JOB)
    settings = TuneSettings(**flat)
    assert settings.stats.epsilon == 0.1 and settings.pair.dtype == "float32" and settings.workers.heartbeat == 10
    assert settings.search.n_drafts == [4, 10] and settings.stores.output_dir == "runs"
    dumped = settings.model_dump()
    dumped.pop("remeasure_costs")  # save_job leaves the one-off action out
    # what issue 37 adds, at their defaults (a job before it profiled batch size 1 alone, and priced there)
    assert [dumped.pop(k) for k in ("serving_batch_sizes", "serving_batch_size", "serving_batch_weights")] == [
        "auto",
        None,
        None,
    ]
    assert dumped.pop("relaxation_scope") == "all"  # issue 34's scope, at its default: every position relaxes
    assert yaml.safe_dump(dumped, sort_keys=False) == OLD_JOB  # the saved job's layout, key order included
    assert TuneSettings(**settings.model_dump()) == settings
    assert TuneSettings.model_validate_json(settings.model_dump_json()) == settings


def test_every_flat_name_belongs_to_exactly_one_group_and_reads_back():
    names = [n for model in GROUPS.values() for n in model.model_fields]
    # plus the task: the 39 settings (deployable_on, relaxation_scope: issue 34; the three serving_batch_*: issue 37)
    assert len(names) == len(set(names)) == 38
    # every field is dumped but deployable_on, applied where the job starts (the kept methods are dumped)
    assert [n for n in flat_fields() if n != "deployable_on"] == list(TuneSettings(task="t").model_dump())
    settings = TuneSettings(**yaml.safe_load(OLD_JOB))
    for group, model in GROUPS.items():
        for name in model.model_fields:
            assert getattr(settings, name) == getattr(getattr(settings, group), name)
    settings.parallel_trials = 3  # a view: the group holds the value
    assert settings.workers.parallel_trials == 3 and settings.model_dump()["parallel_trials"] == 3


def test_groups_given_whole_and_flat_keys_on_top():
    s = TuneSettings(task="t", stats={"epsilon": 0.2, "confidence": 0.8}, confidence=0.95)
    assert (s.epsilon, s.confidence) == (0.2, 0.95)
    copy = s.model_copy(update={"seed": 7, "confirm": "seeds"})
    assert (copy.seed, copy.confirm, copy.epsilon) == (7, "seeds", 0.2) and s.seed == 0
    with pytest.raises(pydantic.ValidationError):
        s.model_copy(update={"confidence": 2.0})  # a copy is validated again


@pytest.mark.parametrize(
    "name", [n for n, f in flat_fields().items() if f.annotation in (float, float | None) or n == "c_rel"]
)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_no_number_field_takes_nan_or_infinity(name, value):
    with pytest.raises(pydantic.ValidationError) as err:
        TuneSettings(task="t", **{name: value})
    assert name in err.value.errors()[0]["loc"]


def test_reading_settings_touches_nothing_and_start_resolves_auto(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = TuneSettings(task="t", output_dir="out/deeper", drafter="prompt-lookup", verifier=str(tmp_path))
    assert storage_url(s.stores) == f"sqlite:///{tmp_path / 'out/deeper/optuna.db'}" == s.storage_url
    assert s.backend["runtime"] == "hf" and s.runtime == "auto"  # a folder: transformers; not yet resolved
    assert list(tmp_path.iterdir()) == []  # no property made a folder
    started = start(s)
    assert started.runtime == "hf" and started.model_dump()["runtime"] == "hf"  # what the job records
    assert (tmp_path / "out/deeper").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="--output-dir file/sub: .*file is a file"):
        start(s.model_copy(update={"output_dir": "file/sub"}))


def test_serving_batch_sizes_resolve_where_the_job_starts(tmp_path, monkeypatch):
    import torch

    from relaxtune.decoding.serving import default_batch_sizes

    monkeypatch.chdir(tmp_path)
    here = list(default_batch_sizes("cuda" if torch.cuda.is_available() else "cpu"))
    s = TuneSettings(task="t", drafter="prompt-lookup", verifier=str(tmp_path))
    assert s.serving_batch_sizes == "auto" and s.stats.serving_weights == {1: 1.0}
    started = start(s)
    assert started.serving_batch_sizes == here and started.model_dump()["serving_batch_sizes"] == here
    assert start(started) == started  # resolved once: a second start (the job's, after the CLI's) keeps it
    # the declared size, or the weighted ones, are measured too
    assert start(s.model_copy(update={"serving_batch_size": 24})).serving_batch_sizes == sorted({*here, 24})
    weighted = s.model_copy(update={"serving_batch_weights": "1=0.2,64=0.8"})
    assert weighted.stats.serving_weights == {1: 0.2, 64: 0.8} and start(weighted).serving_batch_sizes == sorted(
        {*here, 64}
    )
    given = TuneSettings(task="t", serving_batch_sizes="16,4", serving_batch_size=8)
    assert given.serving_batch_sizes == [4, 8, 16] and given.stats.serving_weights == {8: 1.0}
    # llama.cpp: a CPU's sizes, at most its contexts' sequence slots (--batch-size)
    llama = s.model_copy(update={"drafter": "m", "runtime": "llamacpp", "batch_size": 8})
    assert start(llama).serving_batch_sizes == [1, 4]
    assert start(llama.model_copy(update={"batch_size": None})).serving_batch_sizes == [1, 4, 16]
    with pytest.raises(ValueError, match="llama.cpp's contexts hold 8 sequences"):
        start(llama.model_copy(update={"serving_batch_size": 16}))


# ------------------------------------------------------------------ options and flow parameters made from the fields


def _help_lines(command: list[str]) -> dict[str, str]:
    """``--flag`` -> its help row, from the rendered ``--help`` (one row per option at this width)."""
    out = runner.invoke(app, [*command, "--help"], env=WIDE)
    assert out.exit_code == 0, out.output
    rows: dict[str, str] = {}
    for line in out.output.splitlines():
        m = re.match(r"[│|]\s+\*?\s*(--[a-z0-9-]+)(?:\s+--[a-z0-9-]+)?\s+(?:-\w\s+)?(.*?)\s*[│|]?$", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} twice in {command} --help"
            rows[m.group(1)] = " ".join(m.group(2).split())
    return rows


def _shown(name, default) -> str:
    if name == "remeasure_costs":
        return "saved-costs"
    return ",".join(map(str, default)) if isinstance(default, list) else str(default)


SHARED = {  # the settings each command takes (tune and export: all of them)
    "tune": list(flat_fields()),
    "export": list(flat_fields()),
    "eval": [
        "task",
        "limit",
        "seed",
        "drafter",
        "verifier",
        "dtype",
        "runtime",
        "drafter_url",
        "verifier_url",
        "tokenizer",
        "native_url",
        "concurrency",
        "batch_size",
        "output_dir",
        "relaxation_scope",
    ],
    "generate": ["drafter", "verifier", "seed", "dtype", "runtime", "tokenizer"],
    "plan": ["task", "epsilon", "confidence", "confirmations", "confirm", "output_dir"],
    "serve": ["drafter", "verifier"],
    "transfer": ["output_dir", "mlflow_uri"],
}


@pytest.mark.parametrize("command", list(SHARED))
def test_help_has_one_option_per_setting_with_the_models_default_and_description(command):
    rows = _help_lines([command])
    for name in SHARED[command]:
        info = flat_fields()[name]
        flag = "--" + name.replace("_", "-")
        row = rows[flag if name != "remeasure_costs" else "--remeasure-costs"]
        assert " ".join(info.description.split()) in row, (flag, row)
        if row.endswith("[required]"):  # this command needs it given (no default shown)
            assert "[default:" not in row, (flag, row)
        elif not info.is_required() and info.default is not None:
            assert row.endswith(f"[default: {_shown(name, info.default)}]"), (flag, row)
        else:
            assert "[default:" not in row, (flag, row)


def test_confirm_help_says_each_thing_once():
    row = _help_lines(["tune"])["--confirm"].split(" ", 1)[1].rsplit(" [default:", 1)[0]
    assert row.count("never sees") == 1 and row.count("'holdout'") == 1 and row.count("'seeds'") == 1


def test_flow_parameters_carry_the_settings_defaults_and_descriptions():
    from prefect.utilities.callables import parameter_schema

    import relaxtune.flows.tune as tune
    from relaxtune.flows.transfer import transfer_matrix

    flows = {
        tune.tune_task: "*",
        tune.tune_all: "*",
        tune.tune_new: "*",
        tune.evaluate_point: "*",
        transfer_matrix: ["output_dir", "mlflow_uri"],
    }  # transfer's methods: the ones judged, not tuned
    for flow, names in flows.items():
        props = parameter_schema(flow.fn).model_dump()["properties"]
        shared = [n for n in props if n in flat_fields() and (names == "*" or n in names)]
        assert shared, flow.name
        for name in shared:
            info = flat_fields()[name]
            assert props[name]["description"].startswith(info.description), (flow.name, name)
            if name in ("methods", "n_drafts"):  # None: the flow's settings dict's, else the model's
                assert props[name]["default"] is None
            elif not info.is_required():
                assert props[name]["default"] == info.default, (flow.name, name)
    assert parameter_schema(tune.tune_task.fn).model_dump()["required"] == ["task"]


# ------------------------------------------------------------------ bad inputs, refused before any model loads


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working folder with a model folder ``m``, a GGUF-named file, a plain file, a task of 60
    problems; every way a model loads, converts or a server starts fails the test."""
    import relaxtune.backends.embedded as embedded
    import relaxtune.backends.hf as hf
    import relaxtune.backends.load as load
    import relaxtune.backends.sglang_launch as launch
    import relaxtune.job.steps as job

    def loaded(*args, **kwargs):
        raise AssertionError(f"a model loaded or a server started: {args}")

    for module, name in (
        (load, "load_backend"),
        (job, "load_backend"),
        (hf, "load_pair"),
        (embedded, "ensure_converted"),
        (embedded, "assemble_gguf"),
        (launch, "launch"),
    ):
        monkeypatch.setattr(module, name, loaded)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "p.jsonl").write_text(
        "\n".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) for i in range(60))
    )
    (tmp_path / "many.yaml").write_text(
        f"name: many\nversion: 1\ndataset: {{path: json, data_files: {tmp_path / 'p.jsonl'}}}\n"
        "fields: {question: question, answer: answer}\nprompt: {template: '{question} = ?'}\n"
        "grader: {kind: math}\nsampling: {temperature: 0.8, top_p: 1.0, top_k: null}\nmax_new_tokens: 10\n"
    )
    (tmp_path / "list.yaml").write_text("- epsilon: 0.1\n")
    (tmp_path / "typo.yaml").write_text(f"task: many.yaml\ndrafter: {tmp_path / 'm'}\nverifier: m\nepsilonn: 0.1\n")
    (tmp_path / "nan.yaml").write_text(f"task: many.yaml\ndrafter: {tmp_path / 'm'}\nverifier: m\nepsilon: .nan\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


TUNE = ["tune", "--task", "many.yaml", "--drafter", "m", "--verifier", "m", "--mlflow-uri", "sqlite:///t.db"]
EVAL = ["eval", "--task", "many.yaml", "--drafter", "m", "--verifier", "m"]
SERVE = ["serve", "--drafter", "m", "--verifier", "m"]

BAD = [  # (arguments, what the message must name)
    # the eight of issue 38
    ([*TUNE, "--drafter", "./typo", "--runtime", "hf"], "--drafter ./typo"),
    ([*TUNE, "--dtype", "fp8"], ("'--dtype'", "'fp8'")),
    ([*TUNE, "--dtype", "int4", "--runtime", "llamacpp"], ("'--dtype'", "'int4'")),
    ([*SERVE, "--python", "/nonexistent"], "--python /nonexistent"),
    ([*TUNE, "--output-dir", "afile"], "--output-dir afile"),
    ([*TUNE, "--n-drafts", "3,5,10", "--limit", "20", "--epsilon", "0.3"], "--limit 20, --epsilon 0.3"),
    ([*TUNE, "--epsilon", "nan"], "--epsilon nan"),
    ([*TUNE, "--confirm", "holdout,seeds"], ("'--confirm'", "'holdout,seeds'")),
    # thirty-odd more, as a new user types them
    ([*TUNE, "--epsilon", "inf"], "--epsilon inf"),
    ([*TUNE, "--epsilon", "5%"], "--epsilon 5%"),
    ([*TUNE, "--confidence", "95"], "--confidence 95"),
    ([*TUNE, "--c-rel", "nan"], "--c-rel nan: input should be a finite number"),
    ([*TUNE, "--c-rel", "fast"], "--c-rel: 'fast'"),
    ([*TUNE, "--max-truncated", "-inf"], "--max-truncated -inf"),
    ([*TUNE, "--n-drafts", "3,five"], "--n-drafts: 'five'"),
    ([*TUNE, "--n-drafts", "0,4"], "--n-drafts: n_drafts must be integers >= 1, got [0, 4]"),
    ([*TUNE, "--methods", "cactus,nope"], "--methods: unknown method 'nope'"),
    ([*TUNE, "--methods", "strict"], "--methods: strict is the baseline"),
    ([*TUNE, "--trials", "0"], "--trials 0"),
    ([*TUNE, "--limit", "0"], "--limit 0"),
    ([*TUNE, "--batch-size", "0"], "--batch-size 0"),
    ([*TUNE, "--serving-batch-sizes", "1,x"], "--serving-batch-sizes 1,x: 'x' is not an integer"),
    (
        [*TUNE, "--serving-batch-sizes", "0,4"],
        "--serving-batch-sizes 0,4: serving_batch_sizes must be integers >= 1, got [0, 4]",
    ),
    ([*TUNE, "--serving-batch-sizes", ","], "--serving-batch-sizes: ',' has an empty item"),
    ([*TUNE, "--serving-batch-sizes", "1,,2"], "--serving-batch-sizes: '1,,2' has an empty item"),
    ([*TUNE, "--serving-batch-sizes", "1,1,2"], "--serving-batch-sizes 1,1,2: batch size 1 is given twice"),
    ([*TUNE, "--serving-batch-size", "0"], "--serving-batch-size 0: input should be greater than or equal to 1"),
    ([*TUNE, "--serving-batch-size", "4.5"], "--serving-batch-size 4.5: input should be a valid integer"),
    ([*TUNE, "--serving-batch-weights", "1:0.2"], "--serving-batch-weights: '1:0.2' is not <batch size>=<weight>"),
    ([*TUNE, "--serving-batch-weights", "1=a"], "--serving-batch-weights: '1=a' is not <batch size>=<weight>"),
    ([*TUNE, "--serving-batch-weights", "1=1,1=2"], "--serving-batch-weights 1=1,1=2: batch size 1 is given twice"),
    ([*TUNE, "--serving-batch-weights", "16=0"], "--serving-batch-weights: '16=0': a weight must be a finite"),
    ([*TUNE, "--serving-batch-weights", "1=nan"], "--serving-batch-weights: '1=nan': a weight must be a finite"),
    (
        [*TUNE, "--serving-batch-weights", "0=1"],
        "--serving-batch-weights 0=1: batch size 0: batch sizes are integers >= 1",
    ),
    (
        [*TUNE, "--serving-batch-size", "16", "--serving-batch-weights", "1=0.2,16=0.8"],
        "--serving-batch-size 16 and --serving-batch-weights both say what the search prices at",
    ),
    (
        [*TUNE, "--runtime", "llamacpp", "--batch-size", "4", "--serving-batch-sizes", "1,8"],
        "--serving-batch-sizes 1,8: llama.cpp's contexts hold 4 sequences (--batch-size 4; at most 256)",
    ),
    (
        [*TUNE, "--runtime", "llamacpp", "--serving-batch-sizes", "1,100000"],
        "hold 16 sequences (--batch-size default 16 on llama.cpp; at most 256), so batch size 100000 cannot be "
        "measured: give sizes up to 16",
    ),
    ([*TUNE, "--runtime", "llamacpp", "--batch-size", "300"], "--batch-size 300: llama.cpp's contexts hold at most"),
    ([*TUNE, "--relaxation-scope", "thinking"], "--relaxation-scope thinking: task many does not think"),
    ([*TUNE, "--relaxation-scope", "both"], "--relaxation-scope both: task many does not think"),
    ([*TUNE, "--relaxation-scope", "answer"], ("'--relaxation-scope'", "'answer'")),
    ([*TUNE, "--heartbeat", "30", "--grace-period", "10"], "grace_period (10 s) must exceed heartbeat (30 s)"),
    ([*TUNE, "--storage", "postgres://u@h/db"], "--storage: 'postgres://u@h/db': SQLAlchemy"),
    ([*TUNE, "--storage", "sqlite://"], "--storage: 'sqlite://' is an in-memory"),
    ([*TUNE, "--mlflow-uri", "file:///tmp/mlruns"], "--mlflow-uri: 'file:///tmp/mlruns': MLflow 3"),
    ([*TUNE, "--mlflow-uri", "http://:5000"], "--mlflow-uri: 'http://:5000' names no host"),
    (
        [*TUNE, "--drafter-url", "localhost:30000", "--verifier-url", "localhost:30001"],
        "--drafter-url: 'localhost:30000' is not a server URL",
    ),
    (
        [*TUNE, "--drafter-url", "http://h:1", "--verifier-url", "http://h:port"],
        "--verifier-url: 'http://h:port': the port",
    ),
    ([*TUNE, "--runtime", "llamacpp"], "--verifier m: no such GGUF file"),
    ([*TUNE, "--runtime", "llamacpp", "--verifier", "missing.gguf"], "--verifier missing.gguf"),
    ([*TUNE, "--runtime", "gpu"], ("'--runtime'", "'gpu'")),
    ([*TUNE, "--verifier", "afile"], "--verifier afile: a file"),
    ([*TUNE, "--verifier", "~/no/such/model"], "--verifier ~/no/such/model"),
    ([*TUNE, "--drafter", "prompt-lookup:x"], "--drafter: drafter 'prompt-lookup:x': give prompt-lookup"),
    ([*TUNE, "--drafter", ""], "--drafter is empty"),
    ([*TUNE, "--verifier", "Qwen/Qwen2.5 0.5B"], "--verifier 'Qwen/Qwen2.5 0.5B'"),
    ([*TUNE, "--tokenizer", "./tok"], "--tokenizer ./tok"),
    # a hub id nothing can load (HF_HUB_OFFLINE in the tests): refused before the other model converts
    ([*TUNE, "--verifier", "Qwen/NoSuchModel-1B", "--runtime", "hf"], "--verifier Qwen/NoSuchModel-1B: not in the"),
    ([*TUNE, "--drafter", "org/typo"], "--drafter org/typo: not in the Hugging Face cache and HF_HUB_OFFLINE is set"),
    (
        [*TUNE, "--tokenizer", "org/notok", "--drafter-url", "http://h:1", "--verifier-url", "http://h:2"],
        "--tokenizer org/notok: not in the Hugging Face cache",
    ),
    ([*SERVE, "--verifier", "org/nomodel"], "--verifier org/nomodel: not in the Hugging Face cache"),
    # a fresh helper's trial: a folder that is no model or tokenizer, an empty --config
    ([*TUNE, "--verifier", "emptydir"], "--verifier emptydir: a folder without config.json"),
    ([*SERVE, "--verifier", "emptydir"], "--verifier emptydir: a folder without config.json"),
    ([*TUNE, "--tokenizer", "emptydir"], "--tokenizer emptydir: a folder without tokenizer.json"),
    ([*TUNE, "--config", ""], "--config is empty"),
    ([*TUNE, "--export", "afile/x.yaml"], ("--export afile/x.yaml: lies under the file", "give a path in a folder")),
    ([*TUNE, "--export", "m"], "--export m: a folder"),
    ([*TUNE, "--output-dir", "afile/runs"], "--output-dir afile/runs"),
    ([*TUNE, "--config", "missing.yaml"], "--config missing.yaml"),
    ([*TUNE, "--drafter-url", "http://127.0.0.1:1"], "--drafter-url http://127.0.0.1:1: the SGLang backend needs both"),
    ([*TUNE, "--native-url", "http://127.0.0.1:1"], "--native-url http://127.0.0.1:1: needs --drafter-url"),
    (
        [*TUNE, "--drafter", "prompt-lookup", "--drafter-url", "http://h:1", "--verifier-url", "http://h:2"],
        "--drafter-url http://h:1: --drafter prompt-lookup drafts without a model",
    ),
    ([*TUNE, "--output-dir", "/proc/relaxtune"], "--output-dir /proc/relaxtune: nothing can be written in /proc"),
    ([*TUNE, "--export", "/proc/x/y.yaml"], "--export /proc/x/y.yaml: nothing can be written in /proc"),
    ([*TUNE, "--job-id", " "], "--job-id: ' ': give an id without spaces"),
    ([*TUNE, "--limit", "2.5"], "--limit 2.5: input should be a valid integer"),
    ([*TUNE, "--epsilon", "1e309"], "--epsilon 1e309: input should be a finite number"),
    (["tune", "--config", "typo.yaml"], "typo.yaml: epsilonn: extra inputs are not permitted"),
    (["tune", "--config", "nan.yaml"], "nan.yaml: epsilon nan: input should be a finite number"),
    ([*TUNE, "--config", "list.yaml"], "--config list.yaml"),
    (["export", "--task", "many.yaml", "--epsilon", "nan"], "--epsilon nan"),
    ([*EVAL, "--output-dir", "afile"], "--output-dir afile"),
    ([*EVAL, "--method", "ens", "--alpha", "0.2", "--relaxation-scope", "thinking"], "task many does not think"),
    ([*EVAL, "--relaxation-scope", "both"], "--relaxation-scope both: eval runs one point"),
    ([*EVAL, "--drafter", "./typo"], "--drafter ./typo"),
    ([*EVAL, "--dtype", "fp16"], ("'--dtype'", "'fp16'")),
    ([*EVAL, "--alpha", "nan"], ("'--alpha'", "nan is not a finite number")),
    (
        [*EVAL, "--verifier-url", "127.0.0.1:30001", "--drafter-url", "http://127.0.0.1:30000"],
        "--verifier-url: '127.0.0.1:30001' is not a server URL",
    ),
    (["generate", "hi", "--verifier", "./typo"], "--verifier ./typo"),
    (["generate", "hi", "--temperature", "nan"], ("'--temperature'", "nan is not a finite number")),
    (["generate", "hi", "--dtype", "half"], ("'--dtype'", "'half'")),
    (["plan", "--task", "many.yaml", "--epsilon", "nan"], ("'--epsilon'", "nan is not a finite number")),
    (["plan", "--task", "many.yaml", "--epsilon", "0.1", "--confirm", "both"], ("'--confirm'", "'both'")),
    (["plan", "--task", "many.yaml", "--epsilon", "2"], "--epsilon 2.0: input should be less than or equal to 1"),
    (["plan", "--task", "many.yaml", "--epsilon", "0.1", "--confidence", "0.3"], "--confidence 0.3: input should be"),
    (["plan", "--task", "many.yaml", "--epsilon", "0.1", "--power", "1.5"], "--power must be in (0, 1), got 1.5"),
    (["generate", "hi", "--top-p", "1.5"], "--top-p 1.5: top_p must be in (0, 1]"),
    (["transfer", "--tasks", "a,b", "--confidence", "nan"], ("'--confidence'", "nan is not a finite number")),
    (["ui", "--port", "-1"], "'--port'"),
    ([*EVAL, "--drafter-url", "http://h:1"], "--drafter-url http://h:1: the SGLang backend needs both"),
    ([*SERVE, "--drafter", "./typo"], "--drafter ./typo"),
    ([*SERVE, "--port", "70000"], "--port 70000"),
    ([*SERVE, "--mem-fraction", "0"], "--mem-fraction 0.0"),
    ([*SERVE, "--timeout", "nan"], ("'--timeout'", "nan is not a finite number")),
    ([*SERVE, "--log-dir", "afile"], "--log-dir afile"),
    ([*SERVE, "--device", "gpu"], ("'--device'", "'gpu'")),
    # draft lengths a method or the task's budget cannot hold (found by a fresh-venv trial: OOM, or a crash mid-job)
    ([*TUNE, "--n-drafts", "4,1000000000"], "--n-drafts 4,1000000000: a draft length of 1000000000 exceeds"),
    ([*TUNE, "--methods", "fly", "--n-drafts", "1"], "--methods fly with --n-drafts 1: method 'fly' cannot run at"),
    ([*EVAL, "--method", "cactus", "--alpha", "1", "--n-draft", "1000000000"], "--n-draft 1000000000: a draft"),
    ([*EVAL, "--method", "fly", "--alpha", "0.5", "--n-draft", "1"], "method 'fly' cannot run at draft length N=1"),
]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("args, named", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_bad_input_is_refused_with_exit_code_2_before_any_model_loads(sandbox, args, named):
    before = _files(sandbox)
    out = runner.invoke(app, args, env=WIDE)
    message = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out.output).split())
    assert out.exit_code == 2, (out.exit_code, message, out.exception)
    for part in (named,) if isinstance(named, str) else named:
        assert part in message, message
    assert _files(sandbox) == before  # no file created: no output folder, spec.json, database or log


def test_auto_resolving_to_llamacpp_refuses_sizes_it_cannot_hold_before_loading(tmp_path, monkeypatch):
    """The embedded pair's auto runtime is llama.cpp where it is installed: a size above its slots was refused
    only after the models loaded, as a raw validation error."""
    pytest.importorskip("llama_cpp")
    from typer.testing import CliRunner

    from relaxtune.cli import app

    monkeypatch.chdir(tmp_path)
    args = ["tune", "--task", "humaneval", "--serving-batch-sizes", "1,100000", "--mlflow-uri", "sqlite:///t.db"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    flat = " ".join(out.output.split())
    assert out.exit_code == 2 and "batch size 100000 cannot be measured: give sizes up to 16" in flat
    assert "loading" not in flat and "validation error" not in flat
