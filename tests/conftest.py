"""Shared helpers for the statistical tests: exact goodness-of-fit checks with fixed seeds."""

from __future__ import annotations

import os
import tempfile

# Prefect's test harness: a private home, a generous start-up timeout, no telemetry,
# no external API (set before anything imports prefect).
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="relaxtune-prefect-"))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.pop("PREFECT_API_URL", None)
os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="relaxtune-mlflow-"), "mlflow.db"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pytest
import torch
from scipy import stats

torch.set_num_threads(1)  # tiny models: threads only add overhead (and tests may run beside other work)

P_FLOOR = 1e-4  # a correct sampler passes at this level; the fixed seeds make it deterministic


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of integer ``samples`` against ``probs`` [V],
    pooling cells whose expected count is below 5. A sample in a zero-probability
    cell gives p-value 0."""
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    counts = np.bincount(np.asarray(samples).ravel(), minlength=len(probs)).astype(np.float64)
    n = counts.sum()
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs * n
    big = expected >= 5
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def random_rows(g: torch.Generator, *shape: int, scale: float = 1.5, dtype=torch.float32) -> torch.Tensor:
    """Random probability rows ``[*shape]`` (softmax of scaled Gaussians)."""
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).softmax(-1).to(dtype)


@pytest.fixture(scope="session")
def tiny_pair_dirs(tmp_path_factory):
    """A saved tiny verifier and its noisy-copy drafter, sharing a tokenizer (folders)."""
    from .tiny_models import save_tiny_model

    root = tmp_path_factory.mktemp("models")
    return save_tiny_model(root / "drafter", noise=0.2), save_tiny_model(root / "verifier")


@pytest.fixture(scope="session")
def tiny_backend(tiny_pair_dirs):
    """The tiny saved pair loaded through ``load_pair`` (float32)."""
    from relaxtune.backends.hf import load_pair

    return load_pair(*tiny_pair_dirs, dtype="float32")
