"""``scripts/gpu_check.py``'s real-server cases, run against the stand-ins so the
script keeps working between GPU runs (on tiny models whose every token is EOS,
so each stop-token check has something to find)."""

import importlib.util
import json
import shutil
from pathlib import Path

from relaxtune.backends.hf import load_pair
from relaxtune.backends.sglang import SGLangBackend
from relaxtune.testing.sglang_standin import StandInServer, StandInSpecServer


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parents[1] / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_server_cases_pass_against_the_stand_ins(tiny_pair_dirs, tmp_path):
    verifier = tmp_path / "verifier"
    shutil.copytree(tiny_pair_dirs[1], verifier)
    config = json.loads((verifier / "generation_config.json").read_text())
    (verifier / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": list(range(64))}))
    pair = load_pair(tiny_pair_dirs[0], str(verifier), dtype="float32")
    servers = [
        StandInServer(pair.drafter).start(),
        StandInServer(pair.verifier).start(),
        StandInSpecServer(pair.drafter, pair.verifier, 0.5, 3, tokenizer=pair.tokenizer).start(),
    ]
    try:
        urls = [s.url for s in servers]
        remote = SGLangBackend(urls[0], urls[1], str(verifier))
        native = SGLangBackend(urls[0], urls[1], str(verifier), native_url=urls[2])
        failures: list[str] = []
        _script().server_cases(remote, native, str(verifier), failures)
        assert failures == []
        assert servers[2].threshold == 0.5  # the live threshold was restored
    finally:
        for s in servers:
            s.stop()
