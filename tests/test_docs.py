"""The README and the documentation site: nothing of the old README lost, commands and sample output in step
with the code, generated reference complete, the site's configuration offline (issue 35).

The site itself is built by ``mkdocs build --strict`` in ``.ci/run`` (the ``docs`` extra); these tests need
only the test extra: they render the hooks' generated parts directly.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
MAP = yaml.safe_load((DOCS / "readme-map.yaml").read_text())
MKDOCS = yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hooks_{name}", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load("generate")
sample = _load("main_job_sample")


def flat(text: str) -> str:
    return " ".join(text.split())


def nav_pages(items=None) -> list[str]:
    out = []
    for item in MKDOCS["nav"] if items is None else items:
        for value in item.values() if isinstance(item, dict) else [item]:
            out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def fenced(text: str, lang: str) -> list[str]:
    return [m.group(1).strip("\n") for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)]


# --------------------------------------------------------------------------- nothing lost


@pytest.mark.parametrize("section", MAP["sections"], ids=lambda s: s["heading"])
def test_every_readme_section_lands_in_its_pages(section):
    for place in section["places"]:
        page = DOCS / place["page"]
        assert page.exists(), f"{section['heading']}: {place['page']} does not exist"
        assert place["page"] in nav_pages(), f"{place['page']} is not in mkdocs.yml's nav"
        text = flat(page.read_text())
        for sentence in place["sentences"]:
            assert flat(sentence) in text, f"{section['heading']}: not in {place['page']}: {sentence!r}"


def test_the_map_names_every_heading_of_the_old_readme():
    old = subprocess.run(["git", "show", f"{MAP['readme']}:README.md"], cwd=ROOT, capture_output=True, text=True)
    if old.returncode != 0:
        pytest.skip(f"the README of {MAP['readme']} is not in this clone's history")
    body = re.sub(r"^```.*?^```", "", old.stdout, flags=re.S | re.M)  # comments in code blocks are not headings
    headings = [h.strip() for h in re.findall(r"^#{1,3} .+$", body, re.M)]
    mapped = {s["heading"] for s in MAP["sections"]}
    assert len(headings) == 18 and set(headings) <= mapped, set(headings) - mapped


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "snippets" not in p.parts)
    assert sorted(nav_pages()) == pages


def test_generated_pages_hold_markers_not_copies():
    for page, name in [
        ("reference/cli.md", "cli"),
        ("reference/settings.md", "settings"),
        ("reference/tuned-config.md", "tuned-config"),
        ("reference/methods.md", "methods"),
        ("reference/grading-policy.md", "grading-policy"),
        ("benchmarks/index.md", "benchmarks"),
        ("development/testing.md", "markers"),
    ]:
        text = (DOCS / page).read_text()
        assert f"<!-- relaxtune:generate {name} -->" in text
        assert "--epsilon <float>" not in text and "| `cactus` |" not in text  # nothing generated kept by hand


# --------------------------------------------------------------------------- README


def test_readme_is_short_and_undated():
    assert len(README.encode()) <= 10 * 1024
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "dated measurements belong in the benchmarks history"


def test_readme_commands_and_the_quickstart_agree():
    commands = fenced(README, "bash")
    assert commands == [
        'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[embedded,llamacpp]" && relaxtune tune '
        "--task humaneval --methods cactus,mentored --limit 8 --n-drafts 4 --trials 2",
        'pip install -e ".[test]" && python -m pytest -q',
    ]
    quickstart = (DOCS / "getting-started" / "quickstart.md").read_text()
    assert fenced(quickstart, "bash") == commands
    installation = (DOCS / "getting-started" / "installation.md").read_text()
    assert fenced(installation, "bash") == commands
    assert commands[1] in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command verbatim


def test_readme_links_point_at_existing_pages():
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).exists(), target


def test_readme_flags_are_the_clis():
    from typer.main import get_command

    from relaxtune.cli import app

    tune = get_command(app).get_command(None, "tune")
    flags = {o for p in tune.params for o in p.opts}
    used = set(re.findall(r"(--[a-z][a-z-]+)", fenced(README, "bash")[0]))
    assert used <= flags, used - flags


# --------------------------------------------------------------------------- the sample output


def test_the_sample_output_is_the_jobs_own_summary():
    rendered = sample.summary()
    assert (DOCS / "snippets" / "main-job-output.txt").read_text() == rendered
    shown = fenced(README, "text")[0].splitlines()
    lines = rendered.splitlines()
    at = 0
    for line in shown:  # the README's sample is the output, trimmed: its lines in the same order
        assert line in lines[at:], f"not in the job's output (in order): {line!r}"
        at = lines.index(line, at) + 1
    assert "recommendation: serve the verifier alone (plain decoding)" in "\n".join(shown)


def test_the_sample_configs_words_come_from_the_product():
    from relaxtune.certify.paired_bound import exact_upper
    from relaxtune.certify.planning import plan, split_confidence
    from relaxtune.decoding.serving import ServingProfile
    from relaxtune.decoding.speed import modeled_speedup
    from relaxtune.report.export import load_config
    from relaxtune.tune.confirm import RULE, promise
    from relaxtune.tune.recommend import plain_if_nothing_pays

    c = load_config(sample.CONFIG)
    conf = c.confirmation
    assert conf["confidence_each"] == split_confidence(c.confidence, conf["planned"])
    assert conf["rule"] == RULE and conf["promise"] == promise("holdout", c.confidence, c.epsilon, conf["problems"])
    total = c.problems + conf["problems"]  # the search's problems and the held-out ones (--limit)
    s = c.sample
    p = plan(
        total, c.repeats, c.epsilon, c.confidence, discordance=s["discordance"], planned=conf["planned"], holdout=True
    )
    assert c.sample["line"] == p.line() and c.sample["needed"] == p.needed
    # a real run where no speculative point pays: plain decoding of the verifier, every engine's block saying so
    rec, fast = c.recommendation, c.recommendation.fastest_speculative
    assert (rec.method, rec.decoding, rec.n_draft, rec.modeled_speedup) == ("plain", "plain", None, 1.0)
    assert rec.serving["decoding"] == "plain" and (fast.method, fast.n_draft) == ("strict", 4)
    assert (c.runtime, c.dtype, c.weights["verifier"]["format"]) == ("llamacpp", None, "GGUF Q4_K_M")
    strict = {int(n): v for n, v in c.strict_by_n_draft.items()}
    point = fast.model_dump(include={"method", "knob", "n_draft", "modeled_speedup", "speed_margin", "reason"})
    at = "" if c.serving_batch_sizes == [1] else f" at serving batch size {rec.batch_size}"  # priced where declared
    words = plain_if_nothing_pays(point, strict, c.methods, at)
    assert (rec.reason, words["fastest_speculative"]) == (
        words["reason"],
        point,
    )  # the product's words (none confirmed)
    assert {b["decoding"] for b in c.recommendation.deploy.values()} == {"plain"}
    sglang = c.recommendation.deploy["sglang"]
    assert c.recommendation.serving["sglang_launch_args"] == ["--model-path", sglang["launch_args"][1]]
    assert not any("speculative" in a for a in sglang["launch_args"])
    search = c.problems  # the problems the search ran (the config's problems; the held-out ones apart)
    for m in c.methods.values():
        assert m.closest["drop_upper_bound"] == pytest.approx(exact_upper(search, 0, 0, c.confidence), abs=1e-4)
        profile = ServingProfile.from_dict(c.cost_profile)  # the measured costs per batch size, priced at the declared
        assert m.closest["modeled_speedup"] == pytest.approx(
            modeled_speedup(profile, m.closest["l_accept"], m.closest["n_draft"], 1.0, m.closest["length_ratio"]),
            abs=1e-4,
        )


# --------------------------------------------------------------------------- generated reference


def test_the_cli_reference_has_every_command_and_option():
    from typer.main import get_command

    from relaxtune.cli import app

    text = gen.cli()
    group = get_command(app)
    for name in group.list_commands(None):
        cmd = group.get_command(None, name)
        assert f"## `relaxtune {name}`" in text
        for param in cmd.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert f"`{opt}" in text, (name, opt)
    assert "`relaxtune tasks validate`" in text


def test_the_settings_and_tuned_config_references_have_every_field():
    from relaxtune.report import config_schema as schema

    settings = gen.settings()
    names = gen.setting_names()
    assert "epsilon" in names and "task" in names
    for name in names:
        assert f"| `{name}` | `--{name.replace('_', '-')}` |" in settings
    assert "| `epsilon` | `--epsilon` | `float` | `0.05` | allowed accuracy drop vs strict |" in settings
    text = gen.tuned_config()
    for model in (schema.TunedConfig, schema.MethodResult, schema.Recommendation, schema.Transfer, schema.TransferCell):
        section = text.split(f"### `{model.__name__}`")[1].split("### ")[0]
        for name in model.model_fields:
            assert f"| `{name}` |" in section, (model.__name__, name)
    assert "the confirmation's, at confirmation.confidence" in text  # a field's source comment


def test_the_tuned_config_example_uses_the_schemas_keys():
    from relaxtune.report import config_schema as schema

    page = (DOCS / "reference" / "tuned-config.md").read_text()
    example = fenced(page, "yaml")[0]
    top = set(re.findall(r"^(\w+):", example, re.M))
    assert top <= set(schema.TunedConfig.model_fields), top - set(schema.TunedConfig.model_fields)
    method = example.split("  cactus:\n")[1].split("\nconfirmation:")[0]
    keys = set(re.findall(r"^    (\w+):", method, re.M))
    assert keys <= set(schema.MethodResult.model_fields), keys - set(schema.MethodResult.model_fields)
    rec = example.split("\nrecommendation:\n")[1].split("\nmlflow:")[0]
    keys = set(re.findall(r"^  (\w+):", rec, re.M))
    assert keys <= set(schema.Recommendation.model_fields), keys - set(schema.Recommendation.model_fields)


def test_the_tuned_config_examples_values_are_the_codes():
    """What the annotated example spells out (not ``...``) is what the code writes for that task and method."""
    import yaml

    from relaxtune.decoding.methods import get_method
    from relaxtune.report.config_schema import SCHEMA_VERSION
    from relaxtune.report.export import serving_args
    from relaxtune.tasks.spec import load_task

    example = yaml.safe_load(fenced((DOCS / "reference" / "tuned-config.md").read_text(), "yaml")[0])
    task = load_task(example["task"])
    assert example["schema_version"] == SCHEMA_VERSION
    assert (example["task_version"], example["grader"]["kind"]) == (task.version, task.grader.kind)
    assert example["sampling"] == task.sampling.model_dump()
    cactus = example["methods"]["cactus"]
    assert cactus["knob_name"] == get_method("cactus").knob and set(cactus["knobs"]) == {cactus["knob_name"]}
    served = serving_args("cactus", cactus["knob"], cactus["n_draft"], "d", "v", {})["relaxtune"]
    assert {k: v for k, v in cactus["serving"]["relaxtune"].items() if k != "..."}.items() <= served.items()
    assert example["mlflow"]["experiment"] == f"relaxtune-{task.name}"


def test_the_methods_reference_is_the_registry():
    from relaxtune.decoding.methods import METHODS

    text = gen.methods().split("### ")[0]  # the tuned registry's table (the engines' rules follow, when any)
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == list(METHODS)
    cactus = next(r for r in rows if r.startswith("| `cactus`"))
    assert "| `delta` |" in cactus and "| 0 |" in cactus and "0.1, 0.25, 1, 10" in cactus and "[0, inf)" in cactus


def test_the_grading_policy_renders_its_data_file_or_says_it_is_missing(tmp_path):
    note = gen.grading_policy(gen.ROOT / "relaxtune" / "graders" / "no-such-policy.yaml")
    assert "not found" in note and "no-such-policy.yaml" in note
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "numeric": {"relative": 1e-4},
                "policies": [
                    {
                        "id": "last-box",
                        "we_do": "the last non-empty box",
                        "official": "all boxes as a set",
                        "why": "a|b",
                    },
                    {"id": "truncated", "we_do": "no_answer", "official": "last number", "why": "rambling"},
                ],
            },
            sort_keys=False,
        )
    )
    rows, numeric = gen.grading_policy(policy).split("\n\n", 1)
    assert rows.splitlines()[0] == "| policy | we do | the official grader does | why |"
    assert rows.splitlines()[2:] == [
        "| `last-box` | the last non-empty box | all boxes as a set | a\\|b |",
        "| `truncated` | no_answer | last number | rambling |",
    ]
    assert "| `relative` | 0.0001 |" in numeric
    if gen.POLICY.exists():  # the real file, once it is there: one row per policy the conformance cases name
        first = gen.grading_policy().split("\n\n", 1)[0]
        assert first.count("\n| `") == len(gen.policy_rows(yaml.safe_load(gen.POLICY.read_text())))


def test_the_testing_page_lists_every_marker():
    text = gen.markers()
    for marker in re.findall(r'^\s+"(\w+):', (ROOT / "pyproject.toml").read_text(), re.M):
        assert f"| `{marker}` |" in text
    assert "| `live_sglang` |" in text


# --------------------------------------------------------------------------- benchmarks


def test_a_benchmark_writes_json_that_the_benchmarks_page_renders(tmp_path):
    from relaxtune.bench import coverage

    path = tmp_path / "results" / "coverage.json"
    assert coverage.main(["--quick", "--confidence", "0.9", "--seed", "1", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["command"] == "python -m relaxtune.bench.coverage --quick --confidence 0.9 --seed 1"
    assert result["machine"]["cores"] >= 1 and result["seconds"] > 0
    (table,) = result["tables"]
    assert len(table["rows"]) == 2 * 2 * 6  # problems 8, 30 x repeats 1, 48 x six discordances
    assert all(len(row) == len(table["columns"]) for row in table["rows"])
    page = gen.benchmark_results(path.parent)
    assert "## Coverage of the drop bound" in page and result["command"] in page
    first = table["rows"][0]
    assert "| " + " | ".join(str(v) for v in first) + " |" in page


def test_the_current_figures_are_benchmark_output():
    files = sorted((DOCS / "benchmarks" / "results").glob("*.json"))
    assert files
    for f in files:
        r = json.loads(f.read_text())
        assert r["command"].startswith(f"python -m relaxtune.bench.{r['benchmark']}")
        assert "--json" not in r["command"] and r["machine"]["cpu"] and r["tables"]


def test_write_results_refuses_a_ragged_table(tmp_path):
    from relaxtune.bench.results import machine, started, write_results

    with pytest.raises(ValueError, match="has 1 values for 2 columns"):
        write_results(
            tmp_path / "x.json",
            "coverage",
            "t",
            [],
            started(),
            1.0,
            machine(),
            [{"caption": "c", "columns": ["a", "b"], "rows": [[1]]}],
        )


# --------------------------------------------------------------------------- pointers, variables, offline build


def test_docstrings_point_at_docs_pages_that_exist():
    pointers = set()
    for path in (ROOT / "relaxtune").rglob("*.py"):
        text = path.read_text()
        assert "shared/docs" not in text, f"{path} points at a file outside the repository"
        pointers |= set(re.findall(r"``(docs/[\w/.-]+\.md)``", text))
    assert pointers
    for p in pointers:
        assert (ROOT / p).exists(), p


def test_the_environment_page_names_every_variable_the_code_reads():
    page = (DOCS / "reference" / "environment.md").read_text()
    names = set()
    for folder in ("relaxtune", "tests", "scripts", ".ci", "flows"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh", "") and path.name != Path(__file__).name:
                names |= set(re.findall(r"\bRELAXTUNE_[A-Z_]+[A-Z]\b", path.read_text(errors="replace")))
    assert names and {n for n in names if f"`{n}`" not in page} == set()


def test_the_site_builds_offline_and_reads_the_source_statically():
    assert MKDOCS["theme"]["name"] == "material" and MKDOCS["theme"]["font"] is False
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in MKDOCS["plugins"]]
    assert not {"social", "privacy", "material/social", "material/privacy"} & set(plugins)
    options = next(p for p in MKDOCS["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    python = options["mkdocstrings"]["handlers"]["python"]["options"]
    assert python["allow_inspection"] is False and python["force_inspection"] is False
    assert MKDOCS["hooks"] == ["docs/hooks/generate.py"] and MKDOCS["strict"] is True
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^docs = \[.*"mkdocs-material.*"mkdocstrings\[python\]', pyproject, re.M)
    assert "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text()


def test_the_api_page_documents_modules_that_exist():
    page = (DOCS / "reference" / "api.md").read_text()
    modules = re.findall(r"^::: ([\w.]+)$", page, re.M)
    assert modules
    for m in modules:
        assert (ROOT / (m.replace(".", "/") + ".py")).exists(), m


def test_the_sample_renderer_refuses_a_missing_config_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sample, "OUTPUT", tmp_path / "out.txt")
    for argv in (["--help"], [str(tmp_path / "nope.yaml")]):
        with pytest.raises(SystemExit) as done:
            sample.main(argv)
        assert done.value.code == (0 if argv == ["--help"] else 2)
    assert "no tuned config at" in capsys.readouterr().err and not (tmp_path / "out.txt").exists()
    sample.main([str(sample.CONFIG)])
    assert (tmp_path / "out.txt").read_text() == sample.summary(sample.CONFIG)


def test_the_benchmarks_page_lists_every_benchmark_and_ci_runs_each_short_form(tmp_path):
    runnable = sorted(
        p.stem for p in (ROOT / "relaxtune" / "bench").glob("*.py") if 'if __name__ == "__main__":' in p.read_text()
    )
    assert {"coverage", "engine", "serving", "soak", "tuning"} <= set(runnable)
    (tmp_path / "serving.json").write_text("{}")
    page = gen.benchmark_scripts(tmp_path)
    for name in runnable:
        row = next(line for line in page.splitlines() if f"`python -m relaxtune.bench.{name}`" in line)
        assert row.endswith("| below |" if name == "serving" else "| not written yet |")
    short = (ROOT / "tests" / "test_bench_short.py").read_text() + (ROOT / "tests" / "test_soak.py").read_text()
    assert [n for n in runnable if f'run(tmp_path, "{n}"' not in short and f"bench import {n}" not in short] == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
