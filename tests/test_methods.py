import math

import pytest
import torch
from scipy.spatial.distance import jensenshannon

from relaxtune.decoding.methods import METHODS, Needs, Rows, get_method, js_divergence

PAPER_IDS = [
    "strict",
    "always_accept",
    "ens",
    "mentored",
    "cactus",
    "r_fuzzy",
    "spec_casc_opt",
    "spec_casc_tok",
    "spec_cont_dec",
]


def _rows(seed=0, n=64, v=12, temperature=0.8):
    g = torch.Generator().manual_seed(seed)
    z_p = torch.randn(n, v, generator=g) * 2
    z_q = z_p + torch.randn(n, v, generator=g)
    p = (z_p / temperature).softmax(-1)
    q = (z_q / temperature).softmax(-1)
    x = torch.multinomial(q, 1, generator=g).squeeze(-1)
    return Rows(p, q, x, z_p, z_q, temperature)


def test_registry_holds_the_papers_methods():
    assert list(METHODS) == PAPER_IDS + ["sglang_threshold", "typical", "ears"]
    for spec in METHODS.values():
        assert spec.targets.__doc__ and spec.description
        if spec.has_knob:
            assert spec.grid, spec.id
            for value in spec.grid:
                spec.check_knob(value)
            low, high, _ = spec.search
            spec.check_knob(low)
            spec.check_knob(high)
    assert METHODS["ens"].grid == (0.05, 0.1, 0.2)  # w = 0.95, 0.9, 0.8
    assert METHODS["cactus"].search[2] is True  # the grid spans decades: log scale
    assert Needs.EXTRA_DRAFTER_STEP in METHODS["spec_cont_dec"].needs
    assert METHODS["cactus"].pointwise and not METHODS["r_fuzzy"].pointwise


def test_unknown_method_lists_known_ones():
    with pytest.raises(ValueError, match="unknown method 'eagle'.*strict, always_accept, ens"):
        get_method("eagle")


@pytest.mark.parametrize(
    "method, knob, match",
    [
        ("mentored", 1.0, r"outside the valid range of 'mentored': \[0.0, 1.0\)"),
        ("mentored", -0.1, "outside"),
        ("cactus", -0.5, "outside"),
        ("cactus", math.inf, r"outside the valid range of 'cactus': \[0.0, inf\)"),
        ("ens", 1.5, "outside"),
        ("ens", math.nan, "outside"),
        ("r_fuzzy", 0.8, "outside"),  # JS never exceeds ln 2
        ("spec_casc_tok", 1.2, "outside"),
        ("cactus", None, "needs its knob"),
        ("strict", 0.3, "has no knob"),
    ],
)
def test_knob_errors(method, knob, match):
    with pytest.raises(ValueError, match=match):
        get_method(method).check_knob(knob)


@pytest.mark.parametrize("method", ["mentored", "cactus", "spec_cont_dec"])
def test_greedy_refused_for_methods_that_collapse(method):
    with pytest.raises(ValueError, match="collapses to strict at temperature 0"):
        get_method(method).check_temperature(0.0)
    get_method(method).check_temperature(0.6)


@pytest.mark.parametrize("method", ["strict", "ens", "r_fuzzy", "spec_casc_opt", "spec_casc_tok", "always_accept"])
def test_greedy_allowed_for_methods_that_mix_in_q(method):
    get_method(method).check_temperature(0.0)


@pytest.mark.parametrize("method", PAPER_IDS + ["typical", "ears"])
def test_residual_targets_are_distributions(method):
    spec = METHODS[method]
    rows = _rows()
    for knob in spec.grid or (None,):
        t = spec.targets(rows, knob)
        assert t.pi_res.shape == rows.p.shape
        assert (t.pi_res >= 0).all()
        assert torch.allclose(t.pi_res.sum(-1), torch.ones(len(rows.p)), atol=1e-5)


@pytest.mark.parametrize("method", PAPER_IDS + ["typical", "ears"])
def test_rej_at_equals_full_rows_at_the_draft(method):
    spec = METHODS[method]
    rows = _rows(seed=1)
    for knob in (spec.grid + (spec.search[1],)) if spec.has_knob else (None,):
        full = spec.targets(rows, knob).pi_rej.gather(-1, rows.x[:, None]).squeeze(-1)
        assert torch.allclose(spec.rej_at(rows, knob), full, rtol=1e-5, atol=1e-7), knob


@pytest.mark.parametrize("method", [m for m in PAPER_IDS if METHODS[m].pointwise])
def test_pointwise_methods_read_only_the_drafted_entries(method):
    spec = METHODS[method]
    rows = _rows(seed=4)
    keep = torch.zeros_like(rows.p).scatter_(-1, rows.x[:, None], 1.0)
    sparse = Rows(rows.p * keep, rows.q * keep, rows.x)  # everything but p(x), q(x) wiped
    for knob in spec.grid or (None,):
        assert torch.equal(spec.rej_at(sparse, knob), spec.rej_at(rows, knob))


def test_ens_mixes_and_mentored_scales():
    rows = _rows(seed=2)
    assert torch.allclose(METHODS["ens"].targets(rows, 0.2).pi_rej, 0.8 * rows.p + 0.2 * rows.q)
    t = METHODS["mentored"].targets(rows, 0.7)
    assert torch.allclose(t.pi_rej, rows.p / 0.3) and torch.equal(t.pi_res, rows.p)


def test_cactus_values_and_edge_cases():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [1.0, 0.0, 0.0, 0.0], [0.5, 0.3, 0.2, 0.0]])
    q = torch.full((3, 4), 0.25)
    x = torch.tensor([1, 0, 3])
    t = METHODS["cactus"].targets(Rows(p, q, x), 1.0)
    h = min(1.0, 0.3 + math.sqrt(2 * 0.3 * 0.7))
    scale = (1 - h) / 0.7
    assert torch.allclose(t.pi_res[0], torch.tensor([0.5 * scale, h, 0.2 * scale, 0.0]))
    assert torch.equal(t.pi_res[1], p[1])  # p(x) = 1: the 0/0 scale is 1, no NaN
    assert torch.equal(t.pi_res[2], p[2])  # p(x) = 0: h = 0, the token stays excluded
    big = METHODS["cactus"].targets(Rows(p, q, x), 1e6)
    assert big.pi_res[0, 1].item() == 1.0 and big.pi_res[0].sum().item() == pytest.approx(1.0)


def test_js_divergence_nats():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.6, 0.1, 0.3]])
    js = js_divergence(p, q)
    assert js[0].item() == 0.0
    assert js[1].item() == pytest.approx(math.log(2), abs=1e-6)  # disjoint: ln 2
    assert js[2].item() == pytest.approx(jensenshannon([0.2, 0.3, 0.5], [0.6, 0.1, 0.3]) ** 2, abs=1e-6)
    assert torch.equal(js_divergence(q, p), js)


def test_switch_methods_choose_q_or_p():
    rows = _rows(seed=3)
    js = js_divergence(rows.p, rows.q)
    tau = float(js.median())
    pi = METHODS["r_fuzzy"].targets(rows, tau).pi_rej
    use_q = js <= tau
    assert 0 < int(use_q.sum()) < len(js)
    assert torch.equal(pi[use_q], rows.q[use_q]) and torch.equal(pi[~use_q], rows.p[~use_q])

    pi = METHODS["spec_casc_opt"].targets(rows, 0.0).pi_rej
    use_q = rows.q.amax(-1) >= rows.p.amax(-1)
    assert torch.equal(pi[use_q], rows.q[use_q]) and torch.equal(pi[~use_q], rows.p[~use_q])


def test_spec_casc_tok_at_zero_defers_on_the_argmax():
    p = torch.tensor([[0.6, 0.3, 0.1]])
    q = torch.tensor([[0.2, 0.5, 0.3]])
    z_p = torch.tensor([[2.0, 1.0, 0.0]])
    pi = METHODS["spec_casc_tok"].targets(Rows(p, q, None, z_p), 0.0).pi_res
    # A = {0}: pi = q on A + (q(1) + q(2)) p = [0.2 + 0.8*0.6, 0.8*0.3, 0.8*0.1]
    assert torch.allclose(pi, torch.tensor([[0.68, 0.24, 0.08]]))


def test_spec_casc_tok_near_argmax_set_follows_alpha():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.2, 0.5, 0.3]])
    z_p = torch.tensor([[2.0, 1.7, 0.0]])  # softmax ratio of token 1: e^-0.3 = 0.74 >= 1 - 0.35
    pi = METHODS["spec_casc_tok"].targets(Rows(p, q, None, z_p), 0.35).pi_res
    # A = {0, 1}: pi = q on A + q(2) p = [0.2 + 0.3*0.5, 0.5 + 0.3*0.3, 0.3*0.2]
    assert torch.allclose(pi, torch.tensor([[0.35, 0.59, 0.06]]))


def test_spec_cont_dec_contrasts_on_the_verifier_support():
    z_p = torch.tensor([[1.0, 0.0, -1.0]])
    p = torch.tensor([[2.0, 0.0, -math.inf]]).softmax(-1)  # z_p / T = [2, 0, -2], top-k = 2
    z_q = torch.tensor([[1.0, -1.0, 3.0]])
    pi = METHODS["spec_cont_dec"].targets(Rows(p, p, None, z_p, z_q, 0.5), 1.0).pi_res
    # (2 z_p - z_q) / T on G = {0, 1}: [2, 2] -> uniform
    assert torch.allclose(pi, torch.tensor([[0.5, 0.5, 0.0]]))
    half = METHODS["spec_cont_dec"].targets(Rows(p, p, None, z_p, z_q, 0.5), 0.5).pi_res
    # (1.5 z_p - 0.5 z_q) / T on G: [2, 1]
    assert torch.allclose(half, torch.tensor([[2.0, 1.0, -math.inf]]).softmax(-1))


def test_every_method_declares_named_knobs_and_its_engine():
    """The single-knob view (alpha) maps onto the named knobs; one-knob methods keep alpha's name."""
    from relaxtune.decoding.methods import ENGINE_METHODS

    for spec in {**METHODS, **ENGINE_METHODS}.values():
        assert spec.engine, spec.id
        assert spec.has_knob == bool(spec.knobs), spec.id
        if spec.has_knob and len(spec.knobs) == 1:
            (k,) = spec.knobs
            assert (k.name, k.low, k.high, k.strict) == (spec.knob, spec.low, spec.high, spec.strict_point)
            assert (k.search, k.log) == (spec.search[:2], spec.search[2])
        for value in spec.grid:
            named = spec.named(value)
            assert set(named) == set(spec.knob_names)
    assert METHODS["cactus"].named(0.5) == {"delta": 0.5}
    assert METHODS["r_fuzzy"].is_strict({"tau": -1.0}) and not METHODS["r_fuzzy"].is_strict({"tau": 0.1})
    assert METHODS["typical"].engine.startswith("no engine ships this")
    assert METHODS["ears"].engine.startswith("no engine ships this formula")
    assert "assistant_ensemble_weight" in METHODS["ens"].engine
    with pytest.raises(ValueError, match="has no knob"):
        METHODS["strict"].check_knob({"alpha": 0.1})
    with pytest.raises(ValueError, match="unknown: beta"):
        METHODS["ens"].check_knob({"alpha": 0.1, "beta": 1})
