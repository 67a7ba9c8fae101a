"""prefect.yaml's entrypoints load through Prefect's own loader, from the repository root (the
deployments' working directory), as ``prefect deploy`` and a worker read them."""

from __future__ import annotations

from pathlib import Path

import yaml
from prefect.flows import Flow, load_flow_from_entrypoint

ROOT = Path(__file__).resolve().parents[1]


def test_every_entrypoint_of_prefect_yaml_loads_its_flow(monkeypatch):
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    entrypoints = sorted({d["entrypoint"] for d in spec["deployments"]})
    assert entrypoints == [
        "relaxtune/flows/transfer.py:transfer_matrix",
        "relaxtune/flows/tune.py:tune_new",
        "relaxtune/flows/tune.py:tune_task",
    ]
    monkeypatch.chdir(ROOT)
    for entrypoint in entrypoints:
        flow = load_flow_from_entrypoint(entrypoint)
        assert isinstance(flow, Flow) and flow.fn.__name__ == entrypoint.rpartition(":")[2]
