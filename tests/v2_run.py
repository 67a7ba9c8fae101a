"""The job that wrote ``tests/fixtures/v2_run``: a tiny float32 pair, fixed seeds, one small
job (tiny HF models, 4 problems, one relaxed method, two trials, c_rel given, no MLflow).
``tests/fixtures/v2_run`` holds what the code at main 6bddc2b (records schema v2) wrote;
``test_records.py`` re-exports and resumes it on this code. Run as a script it writes the
job's records JSONL, Optuna storage and tuned YAML under a folder:

    python -m tests.v2_run OUT_DIR
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def golden_settings(out: Path, task: str, **over):
    from relaxtune.tune.settings import TuneSettings

    return TuneSettings(
        **(
            dict(
                task=task,
                methods=["cactus"],
                n_drafts=[2],
                trials=2,
                stage_size=4,
                limit=8,
                c_rel=0.2,
                seed=0,
                dtype="float32",
                output_dir=str(out),
                confirm="seeds",
                epsilon=0.6,
                confirmations=1,
            )
            | over
        )
    )


def write_task(folder: Path) -> str:
    """The golden task ``task/golden.yaml`` under the run's folder (the current directory):
    the tiny math task (its rows copied beside it, named relatively), 8 new tokens."""
    (folder / "task").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / "tiny_math.jsonl", folder / "task" / "tiny_math.jsonl")
    (folder / "task" / "golden.yaml").write_text("""name: golden
version: 1
dataset: {path: json, data_files: tiny_math.jsonl}
fields: {question: question, answer: answer}
prompt: {template: "{question} = ?"}
grader: {kind: math}
sampling: {temperature: 0.8, top_p: 1.0, top_k: null}
max_new_tokens: 8
""")
    return "task/golden.yaml"


def golden_backend(models: Path):
    from relaxtune.backends.hf import load_pair

    from .tiny_models import save_tiny_model

    drafter = save_tiny_model(models / "drafter", noise=0.2)
    verifier = save_tiny_model(models / "verifier")
    backend = load_pair(drafter, verifier, dtype="float32")
    backend.name = "golden-pair"  # records, studies and exports name no folder of this machine
    return backend


def run(out: Path, backend=None, new_trials: bool = True, **over):
    """The golden job in ``out`` (made the current directory: every path it records is relative)."""
    from relaxtune.job.run import run_tune_job

    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)
    task = write_task(Path("."))
    backend = backend or golden_backend(Path("models"))
    return run_tune_job(
        golden_settings(Path("relaxtune-runs"), task, **over),
        backend,
        progress=False,
        track=False,
        new_trials=new_trials,
        log=lambda m: None,
    )


if __name__ == "__main__":
    dest = Path(sys.argv[1])
    print(run(dest.resolve())[1])
