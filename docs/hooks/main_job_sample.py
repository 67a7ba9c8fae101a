"""The main job's sample output, shown in the README and the quickstart, made by the job's own code.

    python docs/hooks/main_job_sample.py            # rewrite docs/snippets/main-job-output.txt
    python docs/hooks/main_job_sample.py CONFIG     # from your own run's relaxtune-runs/humaneval.tuned.yaml

The summary is printed by ``relaxtune.cli.tune._summary`` (what ``relaxtune tune`` prints at its end)
from a tuned config that ``relaxtune.report.export.load_config`` validates:
``docs/snippets/main-job.tuned.yaml`` by default, the tuned config of a real run of the README's first
command on the embedded default (llama.cpp, 2 CPU cores, 2026-12-03: 8 problems, 4 held out, two trials
per method, plain decoding recommended). Its words
(``confirmation``, ``sample``, the notes, the recommendation's reason, ``serving``) come from the
product's functions; ``tests/test_docs.py`` checks both, and that the README's sample is this output,
trimmed, so neither can drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "docs" / "snippets" / "main-job.tuned.yaml"
OUTPUT = ROOT / "docs" / "snippets" / "main-job-output.txt"
WIDTH = 100  # a piped job's tables (relaxtune.cli.app.PIPE_WIDTH)


def summary(config_path: Path = CONFIG, shown_path: str = "relaxtune-runs/humaneval.tuned.yaml") -> str:
    """What ``relaxtune tune`` prints at its end for ``config_path``, as a pipe gets it (no colour, 100 columns)."""
    import importlib

    from relaxtune.cli.tune import _summary
    from relaxtune.report.export import load_config

    console = importlib.import_module("relaxtune.cli.app").console  # the module (the package exports the app)
    color = console.no_color
    console.width, console.no_color = WIDTH, True
    try:
        with console.capture() as captured:
            _summary(load_config(config_path), shown_path)
    finally:
        # back to no fixed width (the app's console is made without one; only the CLI's main() fixes one): restoring
        # the width read before would pin it, and every later table in this process would ignore $COLUMNS
        console.width, console.no_color = None, color
    return "\n".join(line.rstrip() for line in captured.get().splitlines()).strip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    """Rewrite ``OUTPUT`` from a tuned config (``--help``: usage; a missing file: exit 2, naming it)."""
    import argparse

    parser = argparse.ArgumentParser(description="Rewrite docs/snippets/main-job-output.txt from a tuned config.")
    parser.add_argument("config", nargs="?", type=Path, default=CONFIG, help=f"a tuned config (default: {CONFIG})")
    args = parser.parse_args(argv)
    if not args.config.is_file():
        parser.error(f"no tuned config at {args.config}")
    OUTPUT.write_text(summary(args.config))
    print(OUTPUT.read_text(), end="")


if __name__ == "__main__":
    main()
