"""The package's layering: no import circles, and no import from a wing above a module's own.

Each wing's ``__init__`` docstring ends its paragraph with ``May import: ...``, the wings
below it that its modules may import (``relaxtune.job``, ``cli``, ``bench``, ``testing``
and ``flows`` sit above every wing). Every import is read from the source, lazy ones
inside functions included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WINGS = ["decoding", "certify", "backends", "graders", "tasks", "engine", "tune", "report", "transfer"]
# above every wing: the main job, then the faces (a face may use the job and the test helpers)
FACES = {"job": set(WINGS), "testing": set(WINGS) | {"job"}, "cli": set(WINGS) | {"job"},
         "bench": set(WINGS) | {"job", "testing"}, "flows": set(WINGS) | {"job"}, "relaxtune": {"decoding"}}


def modules() -> dict[str, Path]:
    """Every module of relaxtune and flows, by dotted name."""
    out = {}
    for path in [*ROOT.glob("relaxtune/**/*.py"), *ROOT.glob("flows/*.py")]:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The relaxtune and flows modules ``name`` imports (the module itself where a name is not one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t.split(".")[0] in ("relaxtune", "flows") and t != name}
    return found


def wing(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "flows":
        return "flows"
    return parts[1] if len(parts) > 1 else "relaxtune"


def allowed() -> dict[str, set[str]]:
    """Each wing's ``May import:`` line, read from its ``__init__`` docstring."""
    table = dict(FACES)
    for w in WINGS:
        doc = ast.get_docstring(ast.parse((ROOT / "relaxtune" / w / "__init__.py").read_text())) or ""
        line = re.search(r"May import: (.*?)\.?$", doc, re.M)
        assert line, f"relaxtune/{w}/__init__.py: its docstring says nothing of what it may import"
        said = line.group(1)
        table[w] = set() if said.startswith("nothing") else {s.strip() for s in said.split(",")}
        assert table[w] <= set(WINGS[:WINGS.index(w)]), f"{w} may import only wings listed before it: {table[w]}"
    return table


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_every_wing_has_its_paragraph():
    for w in WINGS:
        doc = ast.get_docstring(ast.parse((ROOT / "relaxtune" / w / "__init__.py").read_text()))
        assert doc and len(doc.split()) > 20, f"relaxtune/{w}: a paragraph on what it owns"


def test_no_module_imports_from_a_layer_above_its_own():
    table = allowed()
    wrong = [f"{name} -> {target}" for name, targets in graph().items() for target in sorted(targets)
             if wing(target) != wing(name) and wing(target) not in table[wing(name)]]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_circles():
    edges = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else f"{node} -> {nxt}")
            elif nxt in edges and not state.get(nxt):
                visit(nxt, trail + [nxt])
        state[node] = 2

    for start in sorted(edges):
        if not state.get(start):
            visit(start, [start])
    assert not cycles, "import circles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("source, expected", [
    ("from ..tune.judge import x\n", {"relaxtune.tune.judge"}),
    ("from . import judge\n", {"relaxtune.tune.judge"}),
    ("def f():\n    from relaxtune.job import run_tune_job\n", {"relaxtune.job"}),
])
def test_imports_are_read_lazy_and_relative_alike(tmp_path, source, expected):
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = {"relaxtune.tune.judge": path, "relaxtune.job": path, "relaxtune.tune.mod": path}
    assert imports("relaxtune.tune.mod", path, known) == expected
