import math

import pytest
import torch

from relaxtune.decoding.sampling import (
    SamplingParams,
    sample_from_rows,
    sparse_to_dense,
    transform_logits,
    transform_sparse,
)

from .conftest import P_FLOOR, chi2_pvalue


def test_greedy_is_one_hot_at_first_argmax():
    z = torch.tensor([[0.1, 2.0, 2.0, -1.0], [5.0, 0.0, 1.0, 4.0]])
    out = transform_logits(z, SamplingParams(temperature=0.0, top_k=2, top_p=0.5))
    assert torch.equal(out, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))


def test_temperature_only_is_softmax():
    z = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    out = transform_logits(z, SamplingParams(temperature=0.6))
    assert torch.allclose(out, (z / 0.6).softmax(-1), atol=1e-7)


def test_top_k_keeps_ties():
    z = torch.tensor([3.0, 1.0, 1.0, 0.5, -2.0])
    out = transform_logits(z, SamplingParams(top_k=2))
    assert (out > 0).tolist() == [True, True, True, False, False]  # tie at the 2nd value kept
    assert torch.allclose(out[:3], z[:3].softmax(-1))


def test_top_p_exact_values():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    z = probs.log()
    out = transform_logits(z, SamplingParams(top_p=0.8))
    assert torch.allclose(out, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    out = transform_logits(z, SamplingParams(top_p=0.81))
    assert torch.allclose(out, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    out = transform_logits(z, SamplingParams(top_p=0.1))  # the top token is always kept
    assert torch.equal(out, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_top_p_applies_to_renormalised_top_k():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    # after top-k = 3: [4/9, 3/9, 2/9]; top-p 0.7: mass before token 2 is 7/9 >= 0.7 -> drop it
    out = transform_logits(probs.log(), SamplingParams(top_k=3, top_p=0.7))
    assert torch.allclose(out, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))


def _dense_reference(z: torch.Tensor, t: float, k: int, top_p: float) -> torch.Tensor:
    """The transform written out over all V tokens: temperature, top-k mask, softmax, sort, top-p."""
    z = z / t
    z = z.masked_fill(z < z.topk(k, dim=-1).values[..., -1:], float("-inf"))
    probs = z.softmax(-1)
    sorted_probs, order = probs.sort(-1, descending=True)
    keep = (sorted_probs.cumsum(-1) - sorted_probs) < top_p
    probs = probs * torch.zeros_like(keep).scatter_(-1, order, keep)
    return probs / probs.sum(-1, keepdim=True)


@pytest.mark.parametrize("k, top_p", [(20, 0.95), (20, 0.5), (5, 1.0), (64, 0.9)])
def test_top_p_over_the_top_k_equals_the_full_sort(k, top_p):
    z = torch.randn(3, 8, 5000, generator=torch.Generator().manual_seed(k)) * 4
    fast = transform_logits(z, SamplingParams(temperature=0.6, top_k=k, top_p=top_p))
    ref = _dense_reference(z, 0.6, k, top_p)
    assert torch.equal(fast > 0, ref > 0) and torch.allclose(fast, ref, atol=1e-6)
    assert ((fast > 0).sum(-1) <= k).all() and torch.allclose(fast.sum(-1), torch.ones(3, 8))
    z[0, 0, :3] = z[0, 0].max() + 1  # a tie at the cut takes the full path and keeps both tied tokens
    z[0, 0, 3:] = z[0, 0, 3:].clamp_max(z[0, 0, 0] - 1)
    tied = transform_logits(z[0, 0], SamplingParams(top_k=2))
    assert (tied > 0).sum() == 3


@pytest.mark.parametrize("K", [20, 32])
def test_sparse_top_k_reconstructs_dense_exactly(K):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(4, 1000, generator=g) * 3
    params = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)
    dense = transform_logits(z, params)
    lp = z.log_softmax(-1)
    top = lp.topk(K, dim=-1)
    ids, probs, missing = transform_sparse(top.indices, top.values, params)
    rebuilt = sparse_to_dense(ids, probs, 1000)
    assert torch.allclose(rebuilt, dense, atol=1e-6)
    expected_missing = 1 - top.values.double().exp().sum(-1)
    assert torch.allclose(missing.double(), expected_missing, atol=1e-6)


def test_sparse_without_top_k_reports_missing_mass():
    z = torch.zeros(1, 100)  # uniform: top-10 holds 10% of the mass
    top = z.log_softmax(-1).topk(10, dim=-1)
    _, probs, missing = transform_sparse(top.indices, top.values, SamplingParams())
    assert missing.item() == pytest.approx(0.9, abs=1e-6)
    assert torch.allclose(probs, torch.full((1, 10), 0.1))


def test_sparse_errors():
    with pytest.raises(ValueError, match="same shape"):
        transform_sparse(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4), SamplingParams())
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        sparse_to_dense(torch.tensor([[7]]), torch.tensor([[1.0]]), 5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ],
)
def test_params_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_inverse_cdf_sampler_matches_rows_and_skips_zeros():
    g = torch.Generator().manual_seed(5)
    row = torch.tensor([0.0, 2.0, 0.0, 1.0, 0.5, 0.0])  # unnormalised on purpose
    n = 40000
    u = torch.rand(n, generator=g)
    u[0] = 0.0  # the extremes of [0, 1)
    u[1] = 1.0 - 2.0**-24
    draws = sample_from_rows(row.expand(n, -1), u)
    assert set(draws.tolist()) <= {1, 3, 4}
    assert draws[0].item() == 1 and draws[1].item() == 4
    assert chi2_pvalue(draws, row) > P_FLOOR
    assert chi2_pvalue(draws, torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])) < 1e-9  # the test has power


@pytest.mark.parametrize("v", [1000, 257])  # 40 blocks of 25; 17 blocks of 17 with padding
def test_inverse_cdf_over_many_blocks_is_exact_on_a_grid(v):
    g = torch.Generator().manual_seed(v)
    row = torch.rand(v, generator=g) * (torch.rand(v, generator=g) > 0.3)  # zeros scattered in every block
    n = 20000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # stratified: counts are n * p up to rounding
    draws = torch.cat([sample_from_rows(row.expand(2000, -1), chunk.float()) for chunk in u.split(2000)])
    counts = torch.bincount(draws, minlength=v).double()
    expected = n * row.double() / row.double().sum()
    assert bool((counts[row == 0] == 0).all())
    assert float((counts - expected).abs().max()) <= 2.0
