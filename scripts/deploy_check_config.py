"""Write a small tuned config on the embedded pair (transformers runtime, bfloat16) for ``relaxtune deploy-check``
(issue 34's proof on the embedded pair), from the schema via the synthetic job of ``tests/test_deploy_export``:

    python scripts/deploy_check_config.py /tmp/dc/embedded.tuned.yaml
    relaxtune deploy-check /tmp/dc/embedded.tuned.yaml --runtime hf --method ens --knob alpha=0.2 --n-draft 4
    relaxtune deploy-check /tmp/dc/embedded.tuned.yaml --runtime hf --method ens --knob alpha=0.2 --n-draft 4 \\
        --control mirrored                                  # the negative control: must print "disagree"

The config's task is gsm8k_mini (40 problems, 320 new tokens at most, temperature 0.6, top-p 0.95, top-k 20).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(out: str) -> None:
    """Write the config to ``out`` and print its path."""
    from relaxtune.report.export import save_config
    from tests.test_deploy_export import tune

    _, config = tune(Path(out).parent / "job", 0.2, cliff=-1.0, drop=0.25)  # the embedded pair's names, runtime hf
    config = config.model_copy(update={"task": "gsm8k_mini", "dtype": "bfloat16"})
    print(save_config(config, out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "relaxtune-runs/deploy-check.tuned.yaml")
