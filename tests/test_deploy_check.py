"""deploy-check on a tiny pair: relaxtune's ens at alpha and transformers' own assisted
generation at assistant_ensemble_weight = 1 - alpha agree on per-round acceptance counts;
the negative controls (N off by one, the weight mirrored) disagree."""

import pytest
import torch

from relaxtune.backends.transformers_compat import record_assisted_rounds
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.report.deploy_check import (
    Side,
    compare,
    relaxtune_side,
    transformers_side,
)

from .tiny_models import tiny_pair

SP = SamplingParams(1.0, None, 1.0)
PROMPTS = [[1 + (i * 7 + j * 3) % 60 for j in range(5)] for i in range(16)]


@pytest.fixture(scope="module")
def sides():
    torch.set_num_threads(1)
    b = tiny_pair()
    ours = relaxtune_side(b, PROMPTS, method="ens", knob=0.2, n_draft=3, sampling=SP, max_new_tokens=100)
    theirs = transformers_side(b.drafter, b.verifier, PROMPTS, weight=0.8, n_draft=3, sampling=SP, max_new_tokens=100)
    return b, ours, theirs


@pytest.mark.slow
def test_ens_agrees_with_transformers_assisted_generation(sides):
    _, ours, theirs = sides
    c = compare(ours, theirs)
    assert c.rounds[0] >= 500 and c.rounds[1] >= 500
    assert c.verdict == "agree", "\n".join(c.lines())
    assert c.lines()[-1] == "verdict: agree (alpha 0.01)"
    assert set(ours.counts) <= {0, 1, 2, 3} and set(theirs.counts) == {0, 1, 2, 3}
    assert ours.lengths == theirs.lengths == [100] * 16  # no EOS on the tiny pair: the budget ends each


@pytest.mark.slow
def test_n_off_by_one_disagrees(sides):
    b, ours, _ = sides
    off = transformers_side(b.drafter, b.verifier, PROMPTS, weight=0.8, n_draft=4, sampling=SP, max_new_tokens=100)
    c = compare(ours, off)
    assert c.verdict == "disagree" and c.tests["acceptance per round"]["p"] < 1e-6
    assert b.drafter.generation_config.num_assistant_tokens != 4  # the assistant's config is restored


@pytest.mark.slow
def test_mirrored_weight_disagrees(sides):
    b, ours, _ = sides
    mirrored = transformers_side(b.drafter, b.verifier, PROMPTS, weight=0.2, n_draft=3, sampling=SP, max_new_tokens=100)
    c = compare(ours, mirrored, min_rounds=300)  # the mirrored weight accepts more: fewer rounds
    assert c.verdict == "disagree" and c.lines()[-1] == "verdict: disagree (alpha 0.01)"
    assert c.tests["acceptance per round"]["difference"] < -0.5


def test_too_few_rounds_refused_and_accuracy_compared():
    a = Side("a", 2, counts=[0, 1, 2] * 10, lengths=[5, 6], correct=[True] * 30)
    b = Side("b", 2, counts=[0, 1, 2] * 10, lengths=[5, 6], correct=[False] * 30)
    with pytest.raises(ValueError, match="a: 30 compared rounds, need at least 500"):
        compare(a, b)
    c = compare(a, b, min_rounds=30)
    assert c.tests["acceptance per round"]["p"] == 1.0 and c.tests["accuracy"]["difference"] == 1.0
    assert c.verdict == "disagree"


def test_record_assisted_rounds_contract(sides):
    """The compat hook sees every round of transformers' assisted generation, with the
    pinned draft length, and leaves generation itself unchanged."""
    b = sides[0]
    x = torch.tensor([[3, 4, 5]])
    kw = dict(
        attention_mask=torch.ones_like(x),
        assistant_model=b.drafter,
        do_sample=True,
        max_new_tokens=30,
        pad_token_id=0,
        top_k=0,
        temperature=1.0,
    )
    pinned = {
        "num_assistant_tokens": 2,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    saved = {k: getattr(b.drafter.generation_config, k) for k in pinned}
    try:
        for k, v in pinned.items():
            setattr(b.drafter.generation_config, k, v)
        torch.manual_seed(5)
        with record_assisted_rounds() as rounds:
            out = b.verifier.generate(x, **kw)
        torch.manual_seed(5)
        plain = b.verifier.generate(x, **kw)
    finally:
        for k, v in saved.items():
            setattr(b.drafter.generation_config, k, v)
    assert torch.equal(out, plain)
    assert sum(acc + 1 for _, acc in rounds) == 30 and all(d <= 2 for d, _ in rounds)
    assert all(0 <= acc <= d for d, acc in rounds) and rounds[0][0] == 2
