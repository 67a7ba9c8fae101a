"""The terminal as a user meets it: tables that fit narrow terminals (every column
in --json), help that reads cleanly, one line per invalid task field, the
dashboards' recipes, progress as plain lines when piped, and an export that
refuses before loading any model."""

import io
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from relaxtune.cli import app
from relaxtune.decoding.methods import ALL_METHODS
from relaxtune.tasks.spec import load_task
from relaxtune.tune.progress import DEFAULT_INTERVAL, LineProgress, interval_seconds

from .test_figures import tuned
from .tiny_task import write_tiny_task

runner = CliRunner()
BOX = set("│┃┏┓┗┛━─┡┩┠┨╇╈┼┳┻")


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if BOX & set(line)]


@pytest.mark.parametrize("width", [80, 100])
def test_tables_fit_narrow_terminals_and_json_keeps_every_column(width):
    out = runner.invoke(app, ["methods"], env={"COLUMNS": str(width)})
    assert out.exit_code == 0, out.output
    lines = table_lines(out.output)
    assert lines and all(len(line) <= width for line in lines), max(map(len, lines))
    assert all(m in out.output for m in ALL_METHODS) and "not shown at" in out.output
    assert "SGLang's built-in rule" in out.output  # the rule column stays, wrapped
    wide = runner.invoke(app, ["methods"], env={"COLUMNS": "250"})
    assert "full rows" in wide.output and "strict at" in wide.output and "not shown" not in wide.output
    full = json.loads(runner.invoke(app, ["methods", "--json"], env={"COLUMNS": str(width)}).output)
    assert [r["method"] for r in full] == list(ALL_METHODS)  # the engines' round-level rules too (fly, trtllm)
    assert set(full[0]) == {
        "method",
        "knob",
        "further knobs",
        "valid range",
        "strict at",
        "paper grid",
        "full rows",
        "rule",
        "engine",
    }
    fly = next(r for r in full if r["method"] == "fly")
    assert (fly["knob"], fly["further knobs"]) == ("fly_entropy_threshold", "fly_window_size, fly_entropy_top_k")
    assert fly["engine"].startswith("vLLM 0.33.0+")

    out = runner.invoke(app, ["tasks"], env={"COLUMNS": str(width)})
    assert out.exit_code == 0 and all(len(line) <= width for line in table_lines(out.output))
    assert "humaneval" in out.output and "gpqa_diamond" in out.output
    tasks = json.loads(runner.invoke(app, ["tasks", "--json"]).output)
    assert {t["task"] for t in tasks} >= {"humaneval", "gsm8k"} and all("repeats" in t for t in tasks)


@pytest.mark.parametrize("width", [80, 100, 250])
def test_the_tune_summary_fits(tmp_path, monkeypatch, capsys, width):
    from relaxtune.cli.tune import _summary

    _, _, config = tuned(tmp_path, cliff=20.0, epsilon=0.2)
    monkeypatch.setenv("COLUMNS", str(width))
    _summary(config, tmp_path / "x.tuned.yaml")
    text = capsys.readouterr().out
    lines = table_lines(text)
    assert lines and all(len(line) <= width for line in lines)
    row = next(line for line in lines if "cactus" in line)
    for cell in (
        "delta=10",
        f"{config.methods['cactus'].modeled_speedup:.2f}",
        f"{config.methods['cactus'].drop_upper_bound:.3f}",
    ):
        assert cell in row  # the decision's columns are never the ones left out
    assert ("not shown at" in text) == (width < 250) and "recommendation: cactus delta=10 N=4" in text


def test_help_texts_have_no_source_line_breaks():
    group = typer.main.get_command(app)

    def commands(cmd, path=()):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from commands(sub, path + (name,))

    seen = 0
    for path, cmd in commands(group):
        for text in [cmd.help or ""] + [p.help or "" for p in cmd.params]:
            assert "\n" not in text.replace("\n\n", ""), (path, text)
        if not path:
            continue
        seen += 1
        out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
        assert out.exit_code == 0 and all(len(line) <= 100 for line in out.output.splitlines())
        intro = out.output.split("Usage:")[1].split("╭")[0].splitlines()[1:]
        for a, b in zip(intro, intro[1:]):  # a line of the description ends early only where a paragraph ends
            if a.strip() and b.strip():
                assert len(a.rstrip()) + 1 + len(b.split()[0]) > 97, (path, a, b)
    assert seen >= 9
    listing = runner.invoke(app, ["--help"], env={"COLUMNS": "250"}).output
    export_help = group.commands["export"].help.split("\n\n")[0]
    assert any(export_help in line for line in listing.splitlines())  # one line where the width allows


def test_schema_errors_show_one_line_per_field(tmp_path, monkeypatch, user_tasks_only):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\nversion: 0\ndataset: {path: json}\nprompt: {templat: '{q}'}\nsampling: {temperature: hot}\n"
    )
    out = runner.invoke(app, ["tasks", "validate", str(bad)], env={"COLUMNS": "100"})
    assert out.exit_code == 1
    assert out.output.splitlines() == [
        f"invalid: invalid task spec {bad}: 4 invalid field(s)",
        "  version: input should be greater than or equal to 1 (got 0)",
        "  prompt.templat: extra inputs are not permitted (got '{q}')",
        "  grader: field required",
        "  sampling.temperature: input should be a valid number, unable to parse string as a number (got 'hot')",
    ]
    bad.write_text("name: bad\n version: 1\n")
    with pytest.raises(ValueError, match="not valid YAML\nline 2, column 9: mapping values are not allowed here$"):
        load_task(bad)
    bad.write_text("name: bad\nversion: 1\ndataset: {path: json}\ngrader: {kind: choice}\n")
    with pytest.raises(ValueError, match=r"1 invalid field\(s\)\n\(spec\): a choice task needs fields.choices"):
        load_task(bad)
    monkeypatch.setenv("RELAXTUNE_EVALS", str(tmp_path))
    listing = json.loads(runner.invoke(app, ["tasks", "--json"]).output)
    assert listing == [
        {
            "task": "bad",
            "version": "-",
            "grader": "invalid",
            "repeats": "-",
            "max tokens": "-",
            "data": "(spec): a choice task needs fields.choices (first = correct answer)",
        }
    ]


def test_ui_prints_the_mlflow_and_optuna_dashboard_recipes():
    out = runner.invoke(app, ["ui", "--storage", "sqlite:///runs/optuna.db", "--port", "5001"], env={"COLUMNS": "100"})
    assert out.exit_code == 0
    lines = out.output.splitlines()
    assert (
        "  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5001 "
        "--workers 1"
    ) in lines
    assert "  open http://127.0.0.1:5001/#/experiments?workflowType=machine_learning" in lines
    assert (
        "  pip install optuna-dashboard" in lines and "  optuna-dashboard sqlite:///runs/optuna.db --port 5081" in lines
    )
    served = runner.invoke(app, ["ui", "--mlflow-uri", "http://tracking:5000/"]).output
    assert (
        "mlflow ui" not in served and "open http://tracking:5000/#/experiments?workflowType=machine_learning" in served
    )


def test_line_progress_prints_plain_timed_lines():
    now = [100.0]
    out = io.StringIO()
    bar = LineProgress(4, "gsm8k strict-N4", file=out, interval=30.0, clock=lambda: now[0], length=200, timer=False)
    steps = [(10.0, 50, None), (25.0, 300, None), (0.0, 0, (1, 120)), (30.0, 300, None)]
    for seconds, tokens, finished in steps:  # lines only once 30 s passed since the last one
        now[0] += seconds
        bar.add_tokens(tokens)
        if finished:
            bar.update(*finished)
        bar.tick()
    bar.update(3, 600)
    bar.close()
    assert out.getvalue().splitlines() == [
        "gsm8k strict-N4: 4 samples to do",
        # no sample done: 4 x 200 expected tokens, 350 decoded, at 10 tokens/s
        "gsm8k strict-N4: 0/4 samples, 350 tokens decoded (10.0 tokens/s), 0:35 elapsed, about 0:45 left",
        # one done (120 tokens): the others at max(120, 200) each, less the 530 in flight
        "gsm8k strict-N4: 1/4 samples, 650 tokens decoded (10.0 tokens/s), 1:05 elapsed, about 0:07 left",
        "gsm8k strict-N4: 4/4 samples done in 1:05, 720 tokens (11.1 tokens/s)",
    ]


def test_the_default_interval_is_30_seconds(monkeypatch):
    monkeypatch.delenv("RELAXTUNE_PROGRESS_SECONDS", raising=False)
    assert DEFAULT_INTERVAL == 30.0 and interval_seconds() == 30.0
    assert LineProgress(1, "x", file=io.StringIO(), timer=False).interval == 30.0
    monkeypatch.setenv("RELAXTUNE_PROGRESS_SECONDS", "0.5")
    assert interval_seconds() == 0.5
    monkeypatch.setenv("RELAXTUNE_PROGRESS_SECONDS", "soon")
    with pytest.raises(ValueError, match="RELAXTUNE_PROGRESS_SECONDS must be a number of seconds >= 0, got 'soon'"):
        interval_seconds()


class SlowRounds:
    """The tiny pair with no EOS (every response runs to its budget) and 40 ms per round."""

    def __init__(self, backend) -> None:
        self._backend, self.eos_token_ids = backend, frozenset()

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def commit_batch(self, batch, tokens) -> None:
        time.sleep(0.04)
        self._backend.commit_batch(batch, tokens)


def test_a_piped_evaluation_prints_lines_while_one_batch_decodes(tmp_path, tiny_backend, monkeypatch):
    """Three samples in one batch end together after about 1.5 s: lines every 0.2 s
    (the interval's stand-in for 30 s) come before any sample ends, with tokens rising."""
    from relaxtune.tune.evaluation import evaluate
    from relaxtune.tune.point_records import DecodeConfig

    monkeypatch.setenv("RELAXTUNE_PROGRESS_SECONDS", "0.2")
    err = io.StringIO()  # not a terminal: plain lines
    monkeypatch.setattr(sys, "stderr", err)
    spec = load_task(write_tiny_task(tmp_path, max_new_tokens=60))
    result = evaluate(
        spec,
        SlowRounds(tiny_backend),
        DecodeConfig("strict", None, 2),
        output_dir=tmp_path / "runs",
        limit=3,
        batch_size=3,
    )
    assert result.n == 3 and {r["response_tokens"] for r in result.records} == {60}
    lines = [line.split(": ", 1)[1] for line in err.getvalue().splitlines() if line.startswith("tiny_math strict")]
    assert lines[0] == "3 samples to do", err.getvalue() and lines[-1].startswith("3/3 samples done in ")
    waiting = list(itertools.takewhile(lambda line: line.startswith("0/3 samples, "), lines[1:]))
    assert len(waiting) >= 3  # lines while no sample had ended (the samples then end and are graded)
    decoded = [int(line.split(", ")[1].split(" tokens")[0].replace(",", "")) for line in waiting]
    assert decoded == sorted(decoded) and 0 < decoded[-1] <= 180 and decoded[0] < decoded[-1]


@pytest.mark.slow
def test_a_piped_command_prints_its_progress_as_plain_lines(tmp_path, tiny_pair_dirs):
    drafter, verifier = tiny_pair_dirs
    task = write_tiny_task(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"RELAXTUNE_PROGRESS_SECONDS": "0"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "relaxtune.cli",
            "eval",
            "--task",
            task,
            "--limit",
            "3",
            "--method",
            "cactus",
            "--alpha",
            "1",
            "-n",
            "2",
            "--drafter",
            drafter,
            "--verifier",
            verifier,
            "--dtype",
            "float32",
            "--output-dir",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.startswith("tiny_math cactus-1__N2__seed0: ")]
    said = [line.split(": ", 1)[1] for line in progress]
    assert len(said) == 4 and said[0] == "3 samples to do" and said[1].startswith("1/3 samples, ")
    assert said[2].startswith("2/3 samples, ") and said[3].startswith("3/3 samples done in ")
    assert " tokens decoded (" in said[1] and said[3].endswith(" tokens/s)")
    assert "\r" not in proc.stderr + proc.stdout
    assert proc.stdout.splitlines()[0] == f"loading {drafter} -> {verifier} ..."  # the spinner, as a line
    assert all(len(line) <= 100 for line in table_lines(proc.stdout))  # a pipe's tables fit 100 columns


def test_export_in_an_empty_folder_refuses_before_loading_models(tmp_path):
    task = write_tiny_task(tmp_path)
    out = runner.invoke(
        app,
        [
            "export",
            "--task",
            task,
            "--output-dir",
            str(tmp_path / "empty"),
            "--drafter",
            str(tmp_path / "no-drafter"),
            "--verifier",
            str(tmp_path / "no-verifier"),
            "--mlflow-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}",
        ],
        env={"COLUMNS": "300"},
    )
    text = " ".join(out.output.split())
    assert out.exit_code != 0 and "nothing to export: no Optuna storage at" in text, text
    assert "no model folder" not in text and not (tmp_path / "mlflow.db").exists()

    unread = Path(task).with_name("unread.yaml")  # a dataset that cannot load: the storage is checked first
    unread.write_text(Path(task).read_text().replace("tiny_math.jsonl", "absent.jsonl"))
    out = runner.invoke(
        app, ["export", "--task", str(unread), "--output-dir", str(tmp_path / "empty")], env={"COLUMNS": "300"}
    )
    text = " ".join(out.output.split())
    assert out.exit_code != 0 and "nothing to export: no Optuna storage at" in text and "absent" not in text, text


def test_pair_names_are_known_before_loading(tiny_pair_dirs):
    from relaxtune.backends.hf import load_pair
    from relaxtune.backends.naming import pair_name

    drafter, verifier = tiny_pair_dirs
    for dtype in ("float32", "bfloat16"):
        assert pair_name(drafter, verifier, dtype) == load_pair(drafter, verifier, dtype=dtype).name
    assert pair_name("qwen2.5-coder-0.5b-instruct", "Qwen/Qwen3-8B") == "qwen2.5-coder-0.5b-instruct->Qwen/Qwen3-8B"
    assert pair_name(None, "./v", "float16") == f"None->{os.path.abspath('v')}@float16"


@pytest.mark.parametrize("installed", [True, False])
def test_the_runtime_defaults_to_llamacpp_for_the_embedded_pair_when_installed(installed, monkeypatch, tiny_pair_dirs):
    from importlib import util

    from relaxtune.backends import load
    from relaxtune.tune.settings import TuneSettings

    find_spec = util.find_spec
    monkeypatch.setattr(
        load.util,
        "find_spec",
        lambda name: (find_spec("json") if installed else None) if name == "llama_cpp" else find_spec(name),
    )
    embedded = "llamacpp" if installed else "hf"
    d, v = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
    assert load.resolve_runtime("auto", d, v) == embedded
    assert load.resolve_runtime("auto", None, v) == embedded  # AR: the verifier alone
    assert load.resolve_runtime("auto", "prompt-lookup", v) == embedded  # no model drafter: the verifier's runtime
    assert load.resolve_runtime("auto", *tiny_pair_dirs) == "hf"  # a folder of another pair
    assert load.resolve_runtime("auto", d, v, "http://a:1", "http://b:2") == "hf"  # served by SGLang
    assert load.resolve_runtime("hf", d, v) == "hf" and load.resolve_runtime("llamacpp", *tiny_pair_dirs) == "llamacpp"
    with pytest.raises(ValueError, match="unknown runtime 'vllm'; use one of auto, hf, llamacpp"):
        load.resolve_runtime("vllm", d, v)
    for runtime in ("auto", "hf", "llamacpp"):  # a malformed lookup name, refused whatever the runtime
        with pytest.raises(ValueError, match="drafter 'prompt-lookup:0': give prompt-lookup or prompt-lookup:<"):
            load.resolve_runtime(runtime, "prompt-lookup:0", v)
    with pytest.raises(ValueError, match="drafter 'prompt-lookup:x'"):
        TuneSettings(task="humaneval", runtime="llamacpp", drafter="prompt-lookup:x")
    with pytest.raises(ValueError, match="--runtime llamacpp runs the models in-process, and --drafter-url"):
        TuneSettings(task="humaneval", runtime="llamacpp", drafter_url="http://a:1", verifier_url="http://b:2")
    lookup = TuneSettings(task="humaneval", runtime="llamacpp", drafter="prompt-lookup:2")
    assert load.backend_name(**lookup.backend) == "prompt-lookup:2->qwen2.5-coder-1.5b-instruct@llamacpp"
    settings = TuneSettings(task="humaneval")  # resolved where the job starts (start), which then records it
    assert settings.runtime == "auto" and settings.backend["runtime"] == embedded
    assert settings.pair.resolved_runtime() == embedded
    assert load.backend_name(**settings.backend).endswith("@llamacpp") == installed
    assert TuneSettings(task="humaneval", runtime="hf").runtime == "hf"


def test_a_check_across_fields_is_reported_without_an_empty_flag():
    from typer.testing import CliRunner

    from relaxtune.cli import app

    out = CliRunner().invoke(
        app,
        ["tune", "--task", "humaneval", "--drafter", "prompt-lookup:0", "--runtime", "llamacpp"],
        env={"COLUMNS": "250"},
    )
    assert out.exit_code == 2
    text = " ".join(out.output.split())
    assert "Invalid value: --drafter: drafter 'prompt-lookup:0': give prompt-lookup" in text and "--:" not in text
    out = CliRunner().invoke(
        app, ["tune", "--task", "humaneval", "--heartbeat", "30", "--grace-period", "10"], env={"COLUMNS": "250"}
    )  # a check across fields: its message names them
    text = " ".join(out.output.split())
    assert out.exit_code == 2 and "Invalid value: grace_period (10 s) must exceed heartbeat (30 s)" in text


def test_version_plain_validation_messages_and_c_rel_precision():
    from importlib import metadata

    from relaxtune.report.config_schema import TunedConfig

    out = runner.invoke(app, ["--version"])
    assert out.exit_code == 0 and out.output == f"relaxtune {metadata.version('relaxtune')}\n"
    out = runner.invoke(app, ["tune", "--task", "humaneval", "--methods", "foo"], env={"COLUMNS": "300"})
    text = " ".join(out.output.replace("│", " ").split())
    assert out.exit_code != 0 and "--methods: unknown method 'foo'; known methods: strict, always_accept," in text
    assert "Value error" not in text, text
    assert TunedConfig._c_rel_precision(0.33912345678) == 0.3391 and TunedConfig._c_rel_precision(0.3) == 0.3


def test_commands_that_only_read_records_load_no_model(tmp_path, tiny_pair_dirs, monkeypatch):
    """``export`` of a finished tuning folder and ``eval`` of a point whose samples are all
    recorded read the records: the loaders are never called."""
    import relaxtune.backends.hf
    import relaxtune.backends.load
    from relaxtune.job.run import run_tune_job
    from relaxtune.tune.settings import TuneSettings

    drafter, verifier = tiny_pair_dirs
    task = write_tiny_task(tmp_path)
    runs, mlflow = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlflow.db'}"
    pair = ["--drafter", drafter, "--verifier", verifier, "--dtype", "float32", "--output-dir", str(runs)]
    run_tune_job(
        TuneSettings(
            task=task,
            methods=["cactus"],
            drafter=drafter,
            verifier=verifier,
            dtype="float32",
            c_rel=0.3,
            limit=4,
            trials=1,
            n_drafts=[2],
            epsilon=0.5,
            output_dir=str(runs),
            mlflow_uri=mlflow,
        ),
        progress=False,
        log=lambda message: None,
    )
    point = ["eval", "--task", task, "--limit", "2", "--method", "cactus", "--alpha", "1", "-n", "2", *pair]
    assert runner.invoke(app, point, env={"COLUMNS": "200"}).exit_code == 0  # generates: loads the pair

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(relaxtune.backends.hf, "load_pair", refuse)
    monkeypatch.setattr(relaxtune.backends.load, "load_backend", refuse)
    out = runner.invoke(
        app, ["export", "--task", task, "--epsilon", "0.9", "--mlflow-uri", mlflow, *pair], env={"COLUMNS": "200"}
    )
    assert out.exit_code == 0, out.output
    assert (runs / "tiny_math.tuned.eps0.9.yaml").exists() and "loading" in out.output
    out = runner.invoke(app, point, env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "2 of 2 samples were read back from these records" in " ".join(out.output.split())
