"""transformers' static ensemble (``assistant_ensemble_weight``) against relaxtune's
``ens``: the compat module's contract, the alpha <-> w mapping, and a chi-square test
that the installed transformers' own ``_speculative_sampling`` and ``ens`` at
``alpha = 1 - w`` agree (acceptance counts and emitted tokens over 20,000 rounds), so
a transformers upgrade that changes the rule fails here."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from relaxtune.backends import transformers_compat as compat
from relaxtune.decoding.engine_rules import ens_alpha, ensemble_weight
from relaxtune.decoding.round import verify_rounds

from .conftest import P_FLOOR, random_rows

K, V, ROUNDS = 3, 6, 20_000


def test_contract_of_the_private_call():
    import inspect

    from transformers.generation import utils

    assert tuple(inspect.signature(utils._speculative_sampling).parameters) == compat.SPECULATIVE_SAMPLING_PARAMS
    g = torch.Generator().manual_seed(0)
    z = torch.randn(K + 1, V, generator=g)
    draft = z[:K].argmax(-1)
    # q = p at every drafted position: the ratio is 1, every draft is accepted; the
    # bonus comes from p at K+1, here one-hot
    z[K] = torch.full((V,), -math.inf)
    z[K, 2] = 0.0
    for w in (None, 0.6):
        tokens, n = compat.speculative_sampling(draft, z[:K], z, w)
        assert (tokens, n) == (draft.tolist() + [2], K)
    # a draft the verifier excludes: lossless SD rejects it and samples the residual, here one-hot
    zp = torch.full((K + 1, V), -math.inf)
    zp[:, 4] = 0.0
    zq = torch.full((K, V), -math.inf)
    zq[:, 1] = 0.0
    tokens, n = compat.speculative_sampling(torch.tensor([1, 1, 1]), zq, zp, None)
    assert (tokens, n) == ([4], 0)
    with pytest.raises(ValueError, match="need draft_ids"):
        compat.speculative_sampling(torch.tensor([1, 1]), zq, zp, None)


def test_alpha_and_the_ensemble_weight_map_onto_each_other():
    assert ensemble_weight(0.0) is None and ens_alpha(None) == 0.0
    assert ensemble_weight(0.3) == pytest.approx(0.7) and ens_alpha(0.7) == pytest.approx(0.3)
    with pytest.raises(ValueError, match=r"must lie in \(0, 1\)"):
        ensemble_weight(1.0)
    with pytest.raises(ValueError, match=r"must lie in \(0, 1\)"):
        ens_alpha(1.0)


def _rows():
    g = torch.Generator().manual_seed(7)
    p = random_rows(g, K + 1, V, scale=1.2, dtype=torch.float64)
    q = 0.5 * p[:K] + 0.5 * random_rows(g, K, V, scale=1.2, dtype=torch.float64)
    x = torch.multinomial(q, ROUNDS, replacement=True, generator=g).T.contiguous()  # [ROUNDS, K], x_i ~ q_i
    return p, q, x


def _transformers_outcomes(p, q, x, w):
    torch.manual_seed(1234)  # transformers draws from torch's global generator
    out = np.empty((ROUNDS, 2), dtype=np.int64)
    lp, lq = p.log().float(), q.log().float()
    for r in range(ROUNDS):
        tokens, n = compat.speculative_sampling(x[r], lq, lp, w)
        assert tokens[:n] == x[r, :n].tolist()
        out[r] = (n, tokens[n])
    return out


def _relaxtune_outcomes(p, q, x, alpha):
    pr, qr = p.float().expand(ROUNDS, K + 1, V), q.float().expand(ROUNDS, K, V)
    res = verify_rounds(pr, qr, x, "ens", alpha, torch.Generator().manual_seed(99))
    n = res.accepted
    assert torch.equal(res.tokens[:, :K][torch.arange(K) < n[:, None]], x[torch.arange(K) < n[:, None]])
    return np.stack([n.numpy(), res.tokens[torch.arange(ROUNDS), n].numpy()], 1)


def _pvalue(a, b, cells):
    ka = np.bincount(a, minlength=cells)
    kb = np.bincount(b, minlength=cells)
    table = np.stack([ka, kb])
    table = table[:, table.sum(0) > 0]
    return chi2_contingency(table)[1]


@pytest.fixture(scope="module")
def outcomes():
    p, q, x = _rows()
    return p, q, x, _transformers_outcomes(p, q, x, 0.7)


def test_ens_agrees_with_transformers_speculative_sampling(outcomes):
    p, q, x, hf = outcomes
    ours = _relaxtune_outcomes(p, q, x, 1.0 - 0.7)
    # acceptance counts (0..K), then the joint (accepted, emitted residual/bonus token)
    assert _pvalue(hf[:, 0], ours[:, 0], K + 1) > P_FLOOR
    assert _pvalue(hf[:, 0] * V + hf[:, 1], ours[:, 0] * V + ours[:, 1], (K + 1) * V) > P_FLOOR
    assert 0.2 < (ours[:, 0] == K).mean() < 0.8  # a regime where the weight matters


def test_a_mirrored_weight_is_caught(outcomes):
    """Negative control: ens at alpha = w (the weight mirrored) must disagree, so the
    test above has the power to catch a changed rule."""
    p, q, x, hf = outcomes
    ours = _relaxtune_outcomes(p, q, x, 0.7)
    assert _pvalue(hf[:, 0], ours[:, 0], K + 1) < 1e-6
