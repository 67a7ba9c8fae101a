"""Which model a server serves, against the model a job names (``relaxtune.backends.sglang_models``);
live servers in ``test_sglang_live_faults.py``."""

import pytest

from relaxtune.backends.embedded import cache_dir
from relaxtune.backends.load import load_backend
from relaxtune.backends.sglang import SGLangError
from relaxtune.backends.sglang_models import serves
from relaxtune.testing.sglang_standin import StandInServer


@pytest.mark.parametrize(
    "named, info, ok",
    [
        ("/m/verifier", {"model_path": "/m/verifier"}, True),
        ("/m/verifier/", {"model_path": "/m/verifier"}, True),
        ("/m/drafter", {"model_path": "/m/verifier"}, False),
        ("Qwen/Qwen3-0.6B", {"model_path": "Qwen/Qwen3-0.6B"}, True),
        ("Qwen/Qwen3-0.6B", {"model_path": "/models/qwen3-0.6b"}, True),  # a local copy of the hub id
        ("Qwen/Qwen3-0.6B", {"model_path": "/models/Qwen3-32B"}, False),
        ("Qwen/Qwen3-0.6B", {"model_path": "/x", "served_model_name": "Qwen/Qwen3-0.6B"}, True),
        ("qwen2.5-coder-0.5b-instruct", {"model_path": "Qwen/Qwen2.5-Coder-0.5B-Instruct"}, True),
        ("qwen2.5-coder-1.5b-instruct", {"model_path": "Qwen/Qwen2.5-Coder-0.5B-Instruct"}, False),
    ],
)
def test_serves_compares_names_paths_and_hub_ids(named, info, ok):
    assert serves(named, info) is ok


def test_an_embedded_name_is_served_by_its_converted_folder():
    folder = str(cache_dir() / "qwen2.5-coder-0.5b-instruct" / "hf")
    assert serves("qwen2.5-coder-0.5b-instruct", {"model_path": folder})
    assert not serves("qwen2.5-coder-1.5b-instruct", {"model_path": folder})
    assert not serves("/other/hf", {"model_path": folder})  # two converted folders differ by their model's name


def test_load_backend_refuses_a_server_of_another_model_by_name(tiny_backend, tiny_pair_dirs):
    drafter, verifier = tiny_pair_dirs
    d = StandInServer(tiny_backend.drafter, model_path=drafter).start()
    v = StandInServer(tiny_backend.verifier, model_path=drafter).start()  # serves the drafter again
    try:
        with pytest.raises(
            SGLangError,
            match=rf"verifier server at {v.url} serves '{drafter}' .* not '{verifier}' "
            "as --verifier names it",
        ):
            load_backend(drafter, verifier, drafter_url=d.url, verifier_url=v.url)
        v.model_path = verifier
        backend = load_backend(drafter, verifier, drafter_url=d.url, verifier_url=v.url)
        assert backend.name == f"sglang-{drafter}->{verifier}"
        backend.close()
    finally:
        d.stop()
        v.stop()
