"""A Hugging Face cache of one's own: hub ids the hub-id check finds cached
(``relaxtune.cli.checks.check_hub_id``) without a download."""

from __future__ import annotations

from pathlib import Path


def cache_hub_model(root: Path, repo: str, file: str = "config.json") -> Path:
    """Write ``file`` of ``repo`` at revision main into the cache folder ``root``, in the
    cache's own layout (``models--org--name/refs/main``, ``snapshots/<revision>/``); returns
    the file's path."""
    folder = Path(root) / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text("abc123")
    (folder / "snapshots" / "abc123").mkdir(parents=True, exist_ok=True)
    path = folder / "snapshots" / "abc123" / file
    path.write_text("{}")
    return path
