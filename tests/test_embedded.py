"""Assembling the embedded GGUF from part packages: order, checksum, atomicity, errors."""

import hashlib
import sys
import textwrap

import pytest

from relaxtune.backends import embedded
from relaxtune.backends.embedded import EmbeddedModel, assemble_gguf


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three importable part packages ``fakepart1..3`` holding known bytes."""
    chunks = [b"GGUF" + bytes(range(50)), bytes(range(200, 256)) * 3, b"tail"]
    for i, chunk in enumerate(chunks, 1):
        pkg = tmp_path / "site" / f"relaxtune_fakepart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        (pkg / "__init__.py").write_text(
            textwrap.dedent(f"""
            import os
            def get_part_path():
                return os.path.join(os.path.dirname(__file__), "data", "part{i:02d}.bin")
        """)
        )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("RELAXTUNE_CACHE", str(tmp_path / "cache"))
    blob = b"".join(chunks)
    model = EmbeddedModel("fake", "x/fake", "relaxtune-fakepart", 3, "1.0", len(blob), hashlib.sha256(blob).hexdigest())
    yield model, blob
    for i in range(1, 4):
        sys.modules.pop(f"relaxtune_fakepart{i}", None)


def test_assembles_in_order_and_reuses(fake_parts, tmp_path):
    model, blob = fake_parts
    path = assemble_gguf(model)
    assert path == tmp_path / "cache" / "fake" / "model.gguf"
    assert path.read_bytes() == blob
    mtime = path.stat().st_mtime_ns
    assert assemble_gguf(model) == path and path.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]  # no temporary left


def test_checksum_mismatch_leaves_nothing(fake_parts, tmp_path):
    model, blob = fake_parts
    bad = EmbeddedModel(model.name, model.hf_id, model.package, 3, "1.0", len(blob), "0" * 64)
    with pytest.raises(RuntimeError, match="corrupt.*reinstall"):
        assemble_gguf(bad)
    assert list((tmp_path / "cache" / "fake").iterdir()) == []


def test_missing_part_is_named(fake_parts):
    model, blob = fake_parts
    more = EmbeddedModel(model.name, model.hf_id, model.package, 4, "1.0", len(blob), model.sha256)
    with pytest.raises(RuntimeError, match=r"relaxtune-fakepart4==1.0.*relaxtune\[embedded\]"):
        assemble_gguf(more)


def test_pinned_parts_match_the_extra():
    from pathlib import Path

    import tomllib

    extra = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["embedded"]
    for model in (embedded.DRAFTER, embedded.VERIFIER):
        assert set(model.requirements()) <= set(extra)
