"""SGLang's own source, for contract tests, without installing SGLang.

``source_root()`` fetches the pinned wheel from the package index once
(``pip download --no-deps``, the CPython 3.11 manylinux build: the Python
sources are the same in every build), unpacks only ``FILES`` into
``~/.cache/relaxtune-test/sglang-<version>/`` (``RELAXTUNE_TEST_CACHE``
overrides the root) and deletes the wheel; later runs read the cache. When the
index cannot be reached the calling test is skipped with the reason.

``load(relpath, keep, namespace)`` executes chosen top-level definitions of
one of those files (classes cut down to chosen methods) in ``namespace``,
which supplies what they use from the rest of SGLang (small stubs, named in
the calling test). Nothing else of the file runs, so importing SGLang (and its
torch, CUDA and ZMQ stack) is never needed.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

import pytest

from relaxtune.backends.sglang_launch import SGLANG_VERSION

FILES = (
    "sglang/srt/managers/tokenizer_manager.py",
    "sglang/srt/managers/schedule_batch.py",
    "sglang/srt/managers/scheduler_components/logprob_result_processor.py",
    "sglang/srt/managers/scheduler_components/internal_state.py",
    "sglang/srt/layers/logprob_processor.py",
    "sglang/srt/entrypoints/http_server.py",
    "sglang/srt/runtime_context.py",
)


_UNAVAILABLE: dict[str, str] = {}  # version -> why it could not be fetched (asked once per session)


def source_root(version: str = SGLANG_VERSION) -> Path:
    """The folder holding ``FILES`` of ``sglang==version`` (fetched once).

    Skips the calling test when the wheel cannot be downloaded.
    """
    cache = Path(os.environ.get("RELAXTUNE_TEST_CACHE", Path.home() / ".cache" / "relaxtune-test"))
    root = cache / f"sglang-{version}"
    if all((root / f).is_file() for f in FILES):
        return root
    if version in _UNAVAILABLE:
        pytest.skip(_UNAVAILABLE[version])
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_34_x86_64",
            "--timeout",
            "30",
            "--retries",
            "2",
            "--quiet",
            "--dest",
            tmp,
            f"sglang=={version}",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            wheels = list(Path(tmp).glob("sglang-*.whl"))
            said = (done.stderr or done.stdout or "no output").strip().splitlines()[-1]
            why = "" if done.returncode == 0 and wheels else said
        except subprocess.TimeoutExpired:
            why = "no answer within 10 minutes"
        if why:
            _UNAVAILABLE[version] = f"sglang=={version} could not be downloaded from the package index: {why}"
            pytest.skip(_UNAVAILABLE[version])
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in FILES:
                wheel.extract(name, partial)
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)  # complete or absent: an interrupted run leaves no half cache
    return root


def _cut(node: ast.stmt, keep) -> ast.stmt:
    """``node`` cut down: a class to the methods named in ``keep`` (the whole class
    when None), without its bases and class attributes (they live elsewhere in
    SGLang); a module-level function without its decorators (routes, caches)."""
    if isinstance(node, ast.ClassDef) and keep is not None:
        methods = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if set(keep) - set(methods):
            raise LookupError(f"class {node.name} has no method(s) {sorted(set(keep) - set(methods))}")
        node.body = [methods[name] for name in keep] or [ast.Pass()]
        node.bases, node.keywords, node.decorator_list = [], [], []
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node.decorator_list = []
    return node


def load(relpath: str, keep: dict[str, list[str] | None], namespace: dict) -> dict:
    """Execute the top-level definitions (classes, functions, constants) ``keep``
    names (``{name: methods or None}``) of SGLang's ``relpath`` in a module built
    from ``namespace`` and return the module's namespace.

    Raises:
        LookupError: a name or method is not in the file (SGLang moved it).
    """
    path = source_root() / relpath
    tree = ast.parse(path.read_text(), filename=str(path))
    found = {}
    for node in tree.body:
        name = getattr(node, "name", None)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id  # a module constant
        if name in keep:
            found[name] = _cut(node, keep[name])
    if set(keep) - set(found):
        raise LookupError(f"{relpath} has no top-level {sorted(set(keep) - set(found))}")
    future = ast.ImportFrom(module="__future__", names=[ast.alias("annotations")], level=0)
    code = compile(
        ast.fix_missing_locations(ast.Module(body=[future, *found.values()], type_ignores=[])), str(path), "exec"
    )
    module = types.ModuleType(f"sglang_source.{Path(relpath).stem}")  # dataclasses look their module up
    module.__dict__.update(namespace)
    sys.modules[module.__name__] = module
    exec(code, module.__dict__)
    return module.__dict__
