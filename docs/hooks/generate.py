"""MkDocs hooks: the reference pages' generated parts, rendered from the code at build time.

A page asks for a part with a marker line ``<!-- relaxtune:generate NAME -->``; ``on_page_markdown``
replaces it with ``PARTS[NAME]()``. Nothing generated is kept in the repository, so a page cannot go
stale: the CLI comes from the Typer app (``relaxtune.cli.app``), the settings and the tuned config from
their pydantic models, the methods from the registry (``relaxtune.decoding.methods.METHODS``), the
grading policy from ``relaxtune/graders/policy.yaml`` and the current benchmark figures from the JSON
files the benchmark scripts write (``docs/benchmarks/results/*.json``).

The functions are plain (no MkDocs import) so that ``tests/test_docs.py`` renders the same parts.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # this checkout's code, not another install's
    sys.path.insert(0, str(ROOT))
MARKER = re.compile(r"^<!-- relaxtune:generate (?P<name>[\w-]+) -->$", re.M)
POLICY = ROOT / "relaxtune" / "graders" / "policy.yaml"
RESULTS = ROOT / "docs" / "benchmarks" / "results"


def cell(value) -> str:
    """A value as one Markdown table cell (pipes escaped, newlines folded)."""
    text = "" if value is None else str(value)
    return " ".join(text.split()).replace("|", "\\|")


def table(columns: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def prose(doc: str | None) -> str:
    """A docstring as Markdown prose: its text before any Google-style section (``Raises:``...), reST
    literals as Markdown code."""
    text = inspect.cleandoc(doc or "")
    text = re.split(
        r"^(?:Args|Arguments|Attributes|Raises|Returns|Yields|Example|Examples):\s*$", text, maxsplit=1, flags=re.M
    )[0]
    return text.replace("``", "`").strip()


def code(text) -> str:
    """Inline code, or empty."""
    return "" if text in (None, "") else f"`{text}`"


# --------------------------------------------------------------------------- the CLI


def _param_row(param, ctx) -> list:
    """A parameter as ``--help`` shows it: its declaration and its help (with default and required)."""
    record = param.get_help_record(ctx)
    if record is None:  # an argument without help
        return [code(param.name.upper()), ""]
    decl, text = record
    return [code(decl), text]


def _command_md(cmd, path: str, level: int = 2) -> str:
    """One command: heading, help, usage and its parameters; a group's subcommands below it."""
    ctx = cmd.make_context(path, [], resilient_parsing=True)
    out = [f"{'#' * level} `{path}`\n", cmd.help or "", "", "```text", cmd.get_usage(ctx), "```", ""]
    params = [p for p in cmd.params if not getattr(p, "hidden", False)]
    if params:
        out.append(table(["argument / option", "help"], [_param_row(p, ctx) for p in params]))
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(ctx):
            out.append(_command_md(cmd.get_command(ctx, name), f"{path} {name}", level + 1))
    return "\n".join(out)


def cli() -> str:
    """Every command of ``relaxtune.cli.app`` with its help, usage and options (Typer's own command objects)."""
    import typer

    from relaxtune.cli import app

    group = typer.main.get_command(app)
    ctx = group.make_context("relaxtune", ["--help"], resilient_parsing=True)
    names = group.list_commands(ctx)
    parts = [
        f"{group.help}\n",
        table(
            ["command", "what it does"],
            [
                [f"[`relaxtune {n}`](#relaxtune-{n})", (group.get_command(ctx, n).help or "").split("\n\n")[0]]
                for n in names
            ],
        ),
    ]
    parts += [_command_md(group.get_command(ctx, n), f"relaxtune {n}") for n in names]
    return "\n".join(parts)


# --------------------------------------------------------------------------- pydantic models


def _type_name(annotation) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", text)


def _comments(model) -> dict[str, str]:
    """Each field's trailing ``# comment`` in the model's source (the models document fields that way)."""
    out = {}
    for line in inspect.getsource(model).splitlines():
        m = re.match(r"\s+(\w+):[^#]*#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def fields(model, flags: bool = False, helps: dict[str, str] | None = None, skip: set[str] = frozenset()) -> str:
    """A table of a pydantic model's fields: name, type, default, description (else the source comment,
    else ``helps[name]``, e.g. the CLI flag's help)."""
    from pydantic_core import PydanticUndefined

    notes = _comments(model) | {k: v for k, v in (helps or {}).items() if k not in _comments(model)}
    rows = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        default = info.default
        if default is PydanticUndefined:
            default = "required" if info.default_factory is None else "(computed)"
        else:
            default = code(json.dumps(default) if not isinstance(default, str) else default)
        row = [code(name), code(_type_name(info.annotation)), default, info.description or notes.get(name, "")]
        if flags:
            row.insert(1, code("--" + name.replace("_", "-")))
        rows.append(row)
    columns = ["key", "type", "default", "meaning"]
    if flags:
        columns.insert(1, "flag")
    return f"{prose(model.__doc__)}\n\n{table(columns, rows)}"


def settings() -> str:
    """``TuneSettings``: every ``relaxtune tune`` flag and ``--config`` key; one table per group when the
    settings are grouped (``relaxtune.tune.settings.GROUPS``), else one table."""
    import typer

    from relaxtune.cli import app
    from relaxtune.tune import settings as module

    tune = typer.main.get_command(app).get_command(None, "tune")
    ctx = tune.make_context("relaxtune tune", [], resilient_parsing=True)
    helps = {}
    for param in tune.params:  # the flag's help where the model has no description
        record = param.get_help_record(ctx)
        if record and param.name:
            helps[param.name] = re.sub(r"\s*\\?\[(default|required)[^\]]*\]", "", record[1]).strip()
    groups = getattr(module, "GROUPS", None)
    if not groups:
        return fields(module.TuneSettings, flags=True, helps=helps)
    out = [fields(module.TuneSettings, flags=True, helps=helps, skip=set(groups))]
    for name, model in groups.items():
        out.append(f"### `{name}`\n\n{fields(model, flags=True, helps=helps)}")
    return "\n".join(out)


def setting_names() -> list[str]:
    """Every flat setting name (a flag and a ``--config`` key)."""
    from relaxtune.tune import settings as module

    if hasattr(module, "flat_fields"):
        return list(module.flat_fields())
    return list(module.TuneSettings.model_fields)


def tuned_config() -> str:
    """The tuned config's schema, model by model (``relaxtune.report.config_schema``)."""
    from relaxtune.report import config_schema

    out = [f"Schema version {config_schema.SCHEMA_VERSION} (`relaxtune.report.config_schema.SCHEMA_VERSION`).\n"]
    for name in (
        "TunedConfig",
        "MethodResult",
        "Recommendation",
        "ByBatchSize",
        "BatchBest",
        "Transfer",
        "TransferCell",
    ):
        out.append(f"### `{name}`\n\n{fields(getattr(config_schema, name))}")
    return "\n".join(out)


# --------------------------------------------------------------------------- methods


def _range(low, high, high_open) -> str:
    return f"[{low:g}, {high:g}{')' if high_open or high == float('inf') else ']'}"


def _method_rows(registry: dict) -> tuple[list[str], list[list]]:
    """One row per method; an ``engine`` column and named knobs when the registry has them."""
    specs = list(registry.values())
    named = any(getattr(m, "knobs", ()) for m in specs)
    engine = any(getattr(m, "engine", "") for m in specs)
    rows = []
    for m in specs:
        needs = ", ".join(f.name.lower().replace("_", " ") for f in type(m.needs) if f and f in m.needs) or "p(x), q(x)"
        row = [
            code(m.id),
            code(m.knob) or "-",
            "-" if m.knob is None else _range(m.low, m.high, m.high_open),
            "-" if m.strict_point is None else f"{m.strict_point:g}",
            ", ".join(f"{g:g}" for g in m.grid) or "-",
            needs,
            m.description,
        ]
        if named:
            row.insert(
                2,
                "; ".join(
                    f"`{k.name}` {_range(k.low, k.high, k.high_open)}" + (f": {k.doc}" if k.doc else "")
                    for k in getattr(m, "knobs", ())
                )
                or "-",
            )
        if engine:
            row.append(getattr(m, "engine", "") or "-")
        rows.append(row)
    columns = ["method", "knob (alpha)", "range", "strict point", "grid", "needs", "what it does"]
    if named:
        columns.insert(2, "named knobs (the engine's own)")
    if engine:
        columns.append("engine that ships it")
    return columns, rows


def methods() -> str:
    """The registry: knob, valid range, strict point, grid and needs of every method (``METHODS``), then the
    serving engines' round-level rules (``ENGINE_METHODS``) when the registry has them."""
    from relaxtune.decoding import methods as registry

    out = [table(*_method_rows(registry.METHODS))]
    extra = getattr(registry, "ENGINE_METHODS", None)
    if extra:
        out.append(
            "### The serving engines' round-level rules\n\n`relaxtune.decoding.methods.ENGINE_METHODS`: "
            "listed by `relaxtune methods` after the table above and taken by `--methods` as any other "
            "(`ALL_METHODS` joins both registries).\n\n" + table(*_method_rows(extra))
        )
    return "\n".join(out)


# --------------------------------------------------------------------------- grading policy


ROWS_KEYS = ("policies", "policy", "rows", "deviations")
HEADINGS = {"id": "policy", "policy": "policy", "we_do": "we do", "official": "the official grader does", "why": "why"}


def policy_rows(data) -> list[dict]:
    """The rows of the policy file: a list of mappings, or a mapping holding one (``policies``),
    or a mapping of policy name to mapping."""
    if isinstance(data, dict):
        for key in ROWS_KEYS:
            if isinstance(data.get(key), list):
                return data[key]
        if all(isinstance(v, dict) for v in data.values()):
            return [{"policy": k} | v for k, v in data.items()]
    if isinstance(data, list):
        return data
    raise ValueError(f"{POLICY}: no list of policies found")


def grading_policy(path: Path = POLICY) -> str:
    """The grading policy table from its data file (one row per policy, its name first), then any
    other section of the file (e.g. ``numeric``'s tolerances) as key/value tables; a clear note when
    the file is missing."""
    import yaml

    if not path.exists():
        return (
            '!!! warning "Grading policy data file not found"\n'
            f"    This page renders `{path.relative_to(ROOT)}`, which this checkout does not have. "
            "The table of deliberate deviations from the official graders appears here once the file exists; "
            "until then the cases in `tests/conformance/` (their `policy` field) are the reference.\n"
        )
    data = yaml.safe_load(path.read_text())
    rows = policy_rows(data)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns and not isinstance(row[k], (dict, list))]
    columns.sort(key=lambda k: k not in ("policy", "id", "name"))  # the policy's name first (stable otherwise)
    out = [
        table(
            [HEADINGS.get(c, c.replace("_", " ")) for c in columns],
            [[code(r.get(c)) if i == 0 else r.get(c, "") for i, c in enumerate(columns)] for r in rows],
        )
    ]
    for key, value in data.items() if isinstance(data, dict) else []:
        if key not in ROWS_KEYS and isinstance(value, dict):
            out.append(
                f"`{key}` (`{path.name}`):\n\n" + table(["key", "value"], [[code(k), v] for k, v in value.items()])
            )
    return "\n".join(out)


# --------------------------------------------------------------------------- benchmarks


def benchmark_scripts(folder: Path = RESULTS) -> str:
    """Every runnable benchmark (a ``relaxtune/bench`` module with a ``__main__`` block, read
    without importing it): its command, what it measures, and whether results of it are here."""
    import ast

    rows = []
    for path in sorted((ROOT / "relaxtune" / "bench").glob("*.py")):
        source = path.read_text()
        if 'if __name__ == "__main__":' not in source:
            continue
        doc = (ast.get_docstring(ast.parse(source)) or "").split("\n\n")[0].replace("\n", " ")
        written = (folder / f"{path.stem}.json").is_file()
        rows.append([code(f"python -m relaxtune.bench.{path.stem}"), doc, "below" if written else "not written yet"])
    return table(["benchmark", "what it measures", "current results"], rows)


def benchmark_results(folder: Path = RESULTS) -> str:
    """The benchmark scripts (``benchmark_scripts``), then every benchmark result file: what ran,
    where, when, and its tables as written."""
    files = sorted(folder.glob("*.json"))
    out = [benchmark_scripts(folder)]
    if not files:
        return "\n".join(out + ["No benchmark has written its results yet.\n"])
    for f in files:
        r = json.loads(f.read_text())
        m = r["machine"]
        out += [
            f"## {r['title']}\n",
            f"- command: `{r['command']}`",
            f"- machine: {m['cpu']}, {m['cores']} cores, {m['system']}; Python {m['python']}"
            + (f", load average {m['load_before']:.2f} before" if m.get("load_before") is not None else ""),
            f"- run: {r['started']} ({r['seconds']:.0f} s); relaxtune {r['relaxtune_version']}"
            + (f" at `{r['commit']}`" if r.get("commit") else ""),
            f"- file: `docs/benchmarks/results/{f.name}`\n",
        ]
        for t in r["tables"]:
            out += [f"**{t['caption']}**\n", table(t["columns"], t["rows"])]
            out += [f"{n}\n" for n in t.get("notes", [])]
    return "\n".join(out)


# --------------------------------------------------------------------------- test markers


def markers() -> str:
    """The pytest markers and default options declared in ``pyproject.toml``."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    rows = [
        [code(m.split(":", 1)[0].strip()), m.split(":", 1)[1].strip() if ":" in m else ""]
        for m in options.get("markers", [])
    ]
    return (
        table(["marker", "what it marks, and when it runs"], rows)
        + f"\nDefault options (`addopts`): {code(options.get('addopts', ''))}.\n"
    )


PARTS = {
    "cli": cli,
    "settings": settings,
    "tuned-config": tuned_config,
    "methods": methods,
    "grading-policy": grading_policy,
    "benchmarks": benchmark_results,
    "markers": markers,
}


def render(markdown: str) -> str:
    """``markdown`` with every marker replaced by its generated part."""
    return MARKER.sub(lambda m: PARTS[m.group("name")](), markdown)


def on_page_markdown(markdown, page, config, files):
    return render(markdown)
