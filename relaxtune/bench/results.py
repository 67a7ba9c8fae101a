"""A benchmark's results as a JSON file: what ran, on which machine, when, and its tables.

The documentation's benchmarks page (``docs/benchmarks/index.md``) is rendered from these files
(``docs/benchmarks/results/*.json``), so a figure shown as current is one a benchmark wrote.
Every benchmark script takes ``--json PATH`` (``add_json_option``) and records its tables
with a ``Recorder``, which prints each table (``markdown``) and writes them all at the end.
Layout (``write_results``)::

    {"benchmark": "coverage", "title": ..., "command": "python -m relaxtune.bench.coverage ...",
     "started": ISO 8601 UTC, "seconds": float, "relaxtune_version": str, "commit": str | null,
     "machine": {"cpu", "cores", "system", "python", "load_before"},
     "tables": [{"caption", "columns": [str], "rows": [[...]], "notes": [str]}]}
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

__all__ = ["machine", "started", "write_results", "Recorder", "add_json_option", "markdown"]


def machine() -> dict:
    """The machine a benchmark runs on: CPU model, logical cores, OS, Python, 1-minute load average."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_before": load,
    }


def started() -> str:
    """Now, UTC, to the second (ISO 8601)."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_results(
    path: str | Path,
    benchmark: str,
    title: str,
    argv: list[str] | None,
    when: str,
    seconds: float,
    host: dict,
    tables: list[dict],
) -> Path:
    """Write one benchmark run's results to ``path`` (JSON, layout in the module doc) and return the path.

    ``argv`` is the benchmark's own arguments (the command is ``python -m relaxtune.bench.<benchmark>``
    with them, ``--json`` left out); ``host`` is ``machine()`` taken before the run, ``when`` ``started()``.
    Raises ``ValueError`` when a table's row does not have one value per column.
    """
    from importlib import metadata

    for t in tables:
        for row in t["rows"]:
            if len(row) != len(t["columns"]):
                raise ValueError(f"{t['caption']}: row {row} has {len(row)} values for {len(t['columns'])} columns")
    args = list(sys.argv[1:] if argv is None else argv)
    keep = []
    while args:  # the command as a reader would run it, without where its results went
        a = args.pop(0)
        if a == "--json":
            args = args[1:]
        elif not a.startswith("--json="):
            keep.append(a)
    result = {
        "benchmark": benchmark,
        "title": title,
        "command": shlex.join(["python", "-m", f"relaxtune.bench.{benchmark}", *keep]),
        "started": when,
        "seconds": round(seconds, 1),
        "relaxtune_version": metadata.version("relaxtune"),
        "commit": _commit(),
        "machine": host,
        "tables": tables,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def add_json_option(parser) -> None:
    """Add ``--json PATH`` (also write the results as JSON to PATH) to an ``argparse`` parser."""
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")


def markdown(columns: list[str], rows: list[list]) -> str:
    """A markdown table (values as ``str``), as the documentation's page renders it."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows])


class Recorder:
    """One benchmark run's tables, from its start (the machine and clock are read then).

    Args:
        benchmark: the module name under ``relaxtune.bench`` (the command is built from it).
        title: the heading of its section on the benchmarks page.
        argv: the script's arguments (None: ``sys.argv[1:]``).
    """

    def __init__(self, benchmark: str, title: str, argv: list[str] | None = None) -> None:
        import time

        self.benchmark, self.title, self.argv = benchmark, title, argv
        self.host, self.when, self._begin, self.tables = machine(), started(), time.perf_counter(), []

    def table(
        self, caption: str, columns: list[str], rows: list[list], notes: list[str] = (), show: bool = True
    ) -> dict:
        """Record a table (values JSON-able: numbers or strings) and print it (``show``) as
        markdown under its caption, its notes after it.

        Raises:
            ValueError: a row without one value per column.
        """
        for row in rows:
            if len(row) != len(columns):
                raise ValueError(f"{caption}: row {row} has {len(row)} values for {len(columns)} columns")
        t = {"caption": caption, "columns": list(columns), "rows": [list(r) for r in rows], "notes": list(notes)}
        self.tables.append(t)
        if show:
            print(f"\n{caption}\n\n{markdown(t['columns'], t['rows'])}" + "".join(f"\n{n}" for n in notes), flush=True)
        return t

    def write(self, path: str | Path | None) -> Path | None:
        """Write the recorded tables to ``path`` (``write_results``) and say where; nothing when None."""
        import time

        if path is None:
            return None
        out = write_results(
            path,
            self.benchmark,
            self.title,
            self.argv,
            self.when,
            time.perf_counter() - self._begin,
            self.host,
            self.tables,
        )
        print(f"results: {out}")
        return out
