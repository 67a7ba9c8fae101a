"""The package as a packager sees it: every directly imported distribution declared, the version
defined once (pyproject.toml, read back from the installed metadata), the task specs in the package."""

from __future__ import annotations

import ast
import functools
import re
import sys
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# imported by name at run time (a string handed to importlib), not by an import statement
BY_NAME = {"alembic"}
# only in an extra: their modules import them lazily, on the path that needs them (module -> extra, distribution:
# the distribution named here is the one checked where the extra did not install, e.g. llama.cpp did not build)
EXTRA_ONLY = {
    "llama_cpp": ("llamacpp", "llama-cpp-python"),
    "gguf": ("llamacpp", "gguf"),
    "psycopg": ("postgres", "psycopg"),
}


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group(0)).lower()


def imported_top_levels() -> set[str]:
    """The top-level names of every non-stdlib module that relaxtune's source imports (lazy imports too)."""
    found = set(BY_NAME)
    for path in (ROOT / "relaxtune").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("relaxtune", "__future__")}


@functools.cache
def _providers() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions(module: str) -> set[str]:
    """The installed distributions that provide a top-level module, normalised."""
    return {_name(d) for d in _providers().get(module, [])}


def test_every_directly_imported_package_is_declared():
    core = {_name(r) for r in PROJECT["dependencies"]}
    extras = {extra: {_name(r) for r in reqs} for extra, reqs in PROJECT["optional-dependencies"].items()}
    imported = imported_top_levels()
    assert {"torch", "sqlalchemy", "sympy", "alembic", "prefect", "yaml"} <= imported
    missing = []
    for module in sorted(imported):
        dists = distributions(module)
        if not dists and module in EXTRA_ONLY:  # its extra is not installed here: the distribution it names
            dists = {EXTRA_ONLY[module][1]}
        assert dists, f"{module} is imported but installs from no distribution here"
        where = extras[EXTRA_ONLY[module][0]] if module in EXTRA_ONLY else core
        if not dists & where:
            missing.append(f"{module} (from {', '.join(sorted(dists))})")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)
    assert set(EXTRA_ONLY) <= imported  # no stale entries


def test_no_extra_pins_another_torch_and_sglang_is_no_extra():
    assert "sglang" not in PROJECT["optional-dependencies"]
    assert [r for r in PROJECT["dependencies"] if _name(r) == "torch"] == ["torch>=2.13,<2.14"]
    for extra, reqs in PROJECT["optional-dependencies"].items():
        assert not {_name(r) for r in reqs} & {"torch", "transformers"}, extra


def test_the_version_is_read_from_the_package_metadata():
    import relaxtune

    assert relaxtune.__version__ == metadata.version("relaxtune") == PROJECT["version"]
    assert PROJECT["version"] not in (ROOT / "relaxtune" / "__init__.py").read_text()  # written once, in pyproject


def test_the_task_specs_and_flows_ship_as_package_data_and_modules():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert data["packages"]["find"]["include"] == ["relaxtune*"]
    patterns = data["package-data"]["relaxtune.evals"]
    shipped = sorted(p.name for p in (ROOT / "relaxtune" / "evals").iterdir() if p.is_file())
    assert shipped and all(any(Path(name).match(p) for p in patterns) for name in shipped), shipped
    assert (ROOT / "relaxtune" / "flows" / "__init__.py").exists() and not (ROOT / "flows").exists()
    assert not (ROOT / "evals").exists()


def test_the_slow_kinds_are_registered_deselected_by_default_and_run_by_ci():
    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {m.split(":")[0] for m in pytest_ini["markers"]}
    deselected = re.fullmatch(r"-ra -m 'not \((.*)\)'", pytest_ini["addopts"]).group(1).split(" or ")
    ci = re.search(r'^SLOW_KINDS="(.*)"$', (ROOT / ".ci" / "run").read_text(), re.M).group(1).split(" or ")
    assert set(deselected) == set(ci) == registered and len(ci) == len(registered)
    assert {"live_sglang", "postgres", "browser", "sandbox_full", "soak", "interrupts", "slow"} == registered
