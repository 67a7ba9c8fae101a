"""The package's layering, declared once as import-linter contracts in ``pyproject.toml``.

Each wing's ``__init__`` docstring ends its paragraph with ``May import: ...``, the wings
below it that its modules may import; ``[tool.importlinter]`` holds one ``forbidden``
contract per wing and face (``job``, ``testing``, ``cli``, ``bench``, ``flows``), a
``layers`` contract and an ``acyclic_siblings`` one (no import circles). Here: the
docstrings say what the contracts say, the contracts hold on the tree (``lint-imports``,
lazy imports inside functions included), and they fail on a tree that breaks one.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
WINGS = ["decoding", "certify", "backends", "graders", "tasks", "engine", "tune", "report", "transfer"]
FACES = ["job", "testing", "cli", "bench", "flows"]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def contracts() -> dict[str, dict]:
    """The import-linter contracts of pyproject.toml, by id."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["root_packages"] == ["relaxtune"]
    return {c["id"]: c for c in config["contracts"]}


def may_import(wing: str) -> set[str]:
    """A wing's ``May import:`` line, read from its ``__init__`` docstring."""
    doc = ast.get_docstring(ast.parse((ROOT / "relaxtune" / wing / "__init__.py").read_text())) or ""
    line = re.search(r"May import: (.*?)\.?$", doc, re.M)
    assert line, f"relaxtune/{wing}/__init__.py: its docstring says nothing of what it may import"
    said = line.group(1)
    return set() if said.startswith("nothing") else {s.strip() for s in said.split(",")}


def allowed_by_contract(name: str) -> set[str]:
    """What the forbidden contract of ``name`` leaves it free to import (every wing and face not forbidden)."""
    contract = contracts()[name]
    assert contract["type"] == "forbidden" and contract["source_modules"] == [f"relaxtune.{name}"]
    forbidden = {m.removeprefix("relaxtune.") for m in contract["forbidden_modules"]}
    assert forbidden <= set(WINGS + FACES), forbidden - set(WINGS + FACES)
    return set(WINGS + FACES) - forbidden - {name}


def test_every_wing_has_its_paragraph():
    for w in WINGS:
        doc = ast.get_docstring(ast.parse((ROOT / "relaxtune" / w / "__init__.py").read_text()))
        assert doc and len(doc.split()) > 20, f"relaxtune/{w}: a paragraph on what it owns"


def test_every_package_of_relaxtune_is_a_wing_or_a_face():
    found = {p.name for p in (ROOT / "relaxtune").iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    # _started.py: the package's import clock, imported first by __init__.py (a command's "imports" phase)
    assert found - {"__init__.py", "_started.py", "evals"} == set(WINGS) | {"testing", "cli", "bench", "flows", "job"}


def test_the_may_import_lines_say_what_the_contracts_say():
    for i, w in enumerate(WINGS):
        assert may_import(w) == allowed_by_contract(w), f"relaxtune/{w}/__init__.py against pyproject.toml"
        assert may_import(w) <= set(WINGS[:i]), f"{w} may import only wings listed before it"
    # the faces sit above every wing: the main job, then the command line, the flows, the test helpers, the benchmarks
    assert allowed_by_contract("job") == set(WINGS)
    for face in ("cli", "flows", "testing"):
        assert allowed_by_contract(face) == set(WINGS) | {"job"}, face
    assert allowed_by_contract("bench") == set(WINGS) | {"job", "testing"}
    layers = [set(layer.replace("relaxtune.", "").split(" | ")) for layer in contracts()["layers"]["layers"]]
    order = [m for layer in reversed(layers) for m in sorted(layer)]
    assert set(order) == set(WINGS + FACES) and len(order) == len(WINGS + FACES)
    assert contracts()["acyclic"] == {
        "id": "acyclic",
        "name": contracts()["acyclic"]["name"],
        "type": "acyclic_siblings",
        "ancestors": ["relaxtune"],
    }


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_contracts_hold_on_the_tree():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in out.stdout


def test_a_lazy_import_from_a_wing_above_and_an_import_circle_break_the_contracts(tmp_path):
    shutil.copytree(ROOT / "relaxtune", tmp_path / "relaxtune", ignore=shutil.ignore_patterns("__pycache__", "evals"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "relaxtune" / "graders" / "base.py", "a") as f:
        f.write("\n\ndef _late():\n    from relaxtune.engine import batch  # noqa: F401\n")
    out = lint(tmp_path)
    assert out.returncode == 1
    assert "relaxtune.graders may import: nothing of relaxtune outside this wing BROKEN" in out.stdout
    assert "relaxtune.graders.base -> relaxtune.engine.batch" in out.stdout

    shutil.copy(ROOT / "relaxtune" / "graders" / "base.py", tmp_path / "relaxtune" / "graders" / "base.py")
    assert lint(tmp_path).returncode == 0
    planning = tmp_path / "relaxtune" / "certify" / "planning.py"
    planning.write_text(planning.read_text() + "\n\ndef _back():\n    from . import paired_bound  # noqa: F401\n")
    paired = tmp_path / "relaxtune" / "certify" / "paired_bound.py"
    paired.write_text(paired.read_text() + "\n\ndef _forth():\n    from . import planning  # noqa: F401\n")
    out = lint(tmp_path)
    assert out.returncode == 1 and "No import circles between the modules of a package BROKEN" in out.stdout
