"""Prompt lookup drafting: exact drafts on hand-built contexts, what a one-hot q
means for every rule, strict stays lossless with it (chi-square, in-process,
batched and over SGLang), the batched path equals the one-sequence path token for
token in float32, and its cost per drafted token."""

import math

import pytest
import torch

from relaxtune.backends.hf import HFBackend, load_pair
from relaxtune.backends.load import backend_name, load_backend
from relaxtune.backends.lookup import PromptLookupBackend, lookup_drafts, parse_lookup, point_mass_rows
from relaxtune.backends.sglang import SGLangBackend
from relaxtune.decoding.engine_rules import typical_threshold
from relaxtune.decoding.methods import METHODS, Rows, js_divergence
from relaxtune.decoding.rules import cactus_h
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.engine.batch import Request, generate_batch
from relaxtune.engine.sequence import generate
from relaxtune.testing.sglang_standin import StandInServer

from .conftest import P_FLOOR, chi2_pvalue
from .test_engine import _ar_joint
from .tiny_models import tiny_lm

EOS = 0


@pytest.mark.parametrize(
    "context, n, drafts, size",
    [
        ([5, 6, 7, 8, 5, 6], 3, [7, 8, 5], 2),  # the bigram 5 6 seen before: what followed it
        ([1, 2, 9, 1, 2, 4, 1, 2], 2, [4, 1], 2),  # the latest earlier occurrence, not the first
        ([3, 1, 2, 3, 9, 1, 2, 3], 3, [9, 1, 2], 3),  # the longest n-gram first
        ([4, 5, 6], 3, [6, 6, 6], 0),  # no match: the last token, repeated
        ([7], 2, [7, 7], 0),  # a one-token context
        ([7, 7, 7], 4, [7, 7, 7, 7], 2),  # an overlapping match runs on into its own drafts
        ([1, 2, 1, 2, 1], 5, [2, 1, 2, 1, 2], 3),  # period 2 continued past the context's end
        ([1, 2, EOS, 9, 1, 2], 3, [EOS, EOS, EOS], 2),  # after an EOS the drafts repeat it
        ([1, 2, 3, EOS, 1, 2], 3, [3, EOS, EOS], 2),
    ],
)
def test_exact_drafts(context, n, drafts, size):
    assert lookup_drafts(context, n, eos=frozenset({EOS})) == (drafts, size)


def test_ngram_sizes_and_errors():
    ctx = [1, 2, 3, 8, 2, 3, 9, 3]
    assert lookup_drafts(ctx, 2, max_ngram=3) == ([9, 3], 1)  # 2 3 and 9 3 unseen; 3 last seen before 9
    assert lookup_drafts(ctx, 2, max_ngram=3, min_ngram=2) == ([3, 3], 0)
    for bad in (dict(n=0), dict(n=2, min_ngram=3, max_ngram=2)):
        with pytest.raises(ValueError, match="lookup needs"):
            lookup_drafts(ctx, **bad)
    with pytest.raises(ValueError, match="lookup needs"):
        lookup_drafts([], 2)
    assert parse_lookup("prompt-lookup") == 3 and parse_lookup("prompt-lookup:5") == 5
    assert parse_lookup("qwen2.5-coder-0.5b-instruct") is None and parse_lookup(None) is None
    with pytest.raises(ValueError, match="prompt-lookup:<largest n-gram"):
        parse_lookup("prompt-lookup:zero")
    rows = point_mass_rows([2, 0], 4)
    assert rows.tolist() == [[-math.inf, -math.inf, 0.0, -math.inf], [0.0, -math.inf, -math.inf, -math.inf]]


# ---------------------------------------------------- what a one-hot q means, rule by rule


def _point_mass_accept(method, knob, p, x, z_p):
    """The module doc's accept probability of draft x under q = e_x (``PromptLookupBackend``)."""
    px, top = float(p[x]), float(p.max())
    e_x = torch.nn.functional.one_hot(torch.tensor(x), p.shape[-1]).float()
    rule = {
        "strict": lambda: px,
        "always_accept": lambda: 1.0,
        "ens": lambda: (1 - knob) * px + knob,
        "mentored": lambda: min(1.0, px / (1 - knob)),
        "cactus": lambda: float(cactus_h(p[x], knob)),
        "r_fuzzy": lambda: 1.0 if float(js_divergence(p, e_x)) <= knob else px,
        "spec_casc_opt": lambda: 1.0 if knob >= 0 else (1.0 if 1 - top >= -knob * (1 - px) else px),
        "spec_casc_tok": lambda: 1.0 if float(z_p[x]) >= float(z_p.max()) + math.log1p(-knob) else px,
        "spec_cont_dec": lambda: float(p[x] ** (1 + knob) / (p ** (1 + knob)).sum()),
        "sglang_threshold": lambda: min(1.0, px / knob),
        "typical": lambda: float(px > float(typical_threshold(p, knob))),
        "ears": lambda: min(1.0, px + knob * (1 - top)) if px > 0 else 0.0,
    }[method]
    return rule()


@pytest.mark.parametrize("method", list(METHODS))
def test_every_rule_under_a_point_mass_drafter(method):
    spec = METHODS[method]
    g = torch.Generator().manual_seed(11)
    z_p = torch.randn(8, generator=g) * 2
    p = torch.cat([(z_p[:6] / 0.8).softmax(-1), torch.zeros(2)])  # two tokens the verifier excludes
    knobs = [k for k in spec.grid if k != spec.strict_point] + ([-0.3] if method == "spec_casc_opt" else [])
    for knob in knobs or [None]:
        for x in range(8):
            q = torch.nn.functional.one_hot(torch.tensor(x), 8).float()
            z_q = point_mass_rows([x], 8)[0]
            rows = Rows(p[None], q[None], torch.tensor([x]), z_p[None], z_q[None], 0.8)
            got = min(1.0, float(spec.rej_at(rows, knob)[0]))  # q(x) = 1: the ratio is pi_rej(x)
            assert got == pytest.approx(_point_mass_accept(method, knob, p, x, z_p), abs=1e-6), (knob, x)
            resid = (spec.targets(rows, knob).pi_res[0] - q).clamp_min(0)
            assert float(resid[x]) == 0.0  # a rejected copy is never re-emitted
    if method in ("always_accept", "ens", "spec_casc_opt"):  # these accept copies the verifier excludes
        rows = Rows(p[None], torch.nn.functional.one_hot(torch.tensor([7]), 8).float(), torch.tensor([7]), z_p[None])
        assert float(spec.rej_at(rows, spec.grid[-1] if spec.grid else None)[0]) > 0


# ---------------------------------------------------------------- lossless with strict


def _lookup_backend(verifier, **kw) -> PromptLookupBackend:
    return PromptLookupBackend(HFBackend(None, verifier, name="tiny"), **kw)


def test_strict_with_prompt_lookup_is_lossless():
    v = 5
    verifier = tiny_lm(vocab=v, seed=5, scale=3.0)
    backend = _lookup_backend(verifier)
    prompt = [1, 2, 3, 1, 2]  # the lookup drafts 3 1 ...: accepted or not, the output follows p
    joint = _ar_joint(verifier, prompt, v)
    codes = [
        (lambda t: t[0] * v + t[1])(
            generate(backend, prompt, method="strict", n_draft=3, max_new_tokens=2, seed=s).token_ids
        )
        for s in range(600)
    ]
    assert chi2_pvalue(torch.tensor(codes), joint) > P_FLOOR
    requests = [Request(prompt, seed=s, max_new_tokens=2) for s in range(2000)]
    batched = [
        g.token_ids[0] * v + g.token_ids[1]
        for _, g in generate_batch(backend, requests, method="strict", n_draft=3, batch_size=32)
    ]
    assert chi2_pvalue(torch.tensor(batched), joint) > P_FLOOR
    assert chi2_pvalue(torch.tensor(batched), torch.full((v * v,), 1.0 / (v * v))) < 1e-6  # the test has power
    # always_accept copies the context: the output is the lookup's drafts
    aa = [
        generate(backend, prompt, method="always_accept", n_draft=3, max_new_tokens=2, seed=s).token_ids
        for s in range(20)
    ]
    assert all(t == [3, 1] for t in aa)


def test_prompt_lookup_over_sglang_equals_in_process():
    v = 4

    class Tok:
        eos_token_id = None

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    verifier = tiny_lm(vocab=v, seed=5, scale=3.0)
    server = StandInServer(verifier).start()
    try:
        backend = PromptLookupBackend(SGLangBackend(None, server.url, Tok(), vocab_size=v, top_logprobs=v))
        assert backend.drafter is None and backend.native is None and hasattr(backend, "cost_profile")
        prompt = [1, 2, 3, 1, 2]
        local = _lookup_backend(verifier)
        for method, knob in (("strict", None), ("ears", 0.5), ("typical", 0.09)):
            for seed in range(3):  # strict here is lossless as in-process (test above): the same tokens
                kw = dict(
                    method=method, knob=knob, n_draft=3, max_new_tokens=12, seed=seed, sampling=SamplingParams(0.8)
                )
                remote, here = generate(backend, prompt, **kw), generate(local, prompt, **kw)
                assert remote.token_ids == here.token_ids and remote.stats.accepted == here.stats.accepted
    finally:
        server.stop()


# -------------------------------------------------- batched = one sequence, float32


@pytest.mark.parametrize(
    "method, knob",
    [("strict", None), ("ears", 0.3), ("typical", 0.09), ("spec_cont_dec", 0.5), ("sglang_threshold", 0.5)],
)
def test_batched_equals_one_sequence(tiny_pair_dirs, method, knob):
    backend = load_pair("prompt-lookup", tiny_pair_dirs[1], dtype="float32")
    assert isinstance(backend, PromptLookupBackend) and backend.inner.drafter is None and backend.batch_size >= 1
    assert backend.name == "prompt-lookup->" + tiny_pair_dirs[1] + "@float32"
    kw = dict(method=method, knob=knob, n_draft=4, sampling=SamplingParams(0.8))
    requests = [
        Request(
            [(5 * i + 3 * (j % (2 + i))) % 60 + 3 for j in range(6 + 5 * i)],
            seed=40 + i,
            max_new_tokens=20 + 4 * i,
            key=i,
        )
        for i in range(6)
    ]
    alone = {
        r.key: generate(backend, r.prompt_ids, max_new_tokens=r.max_new_tokens, seed=r.seed, **kw) for r in requests
    }
    got = {r.key: g for r, g in generate_batch(backend, requests, batch_size=4, **kw)}
    assert {k: g.token_ids for k, g in got.items()} == {k: g.token_ids for k, g in alone.items()}
    assert [g.stats.accepted for g in got.values()] == [alone[k].stats.accepted for k in got]
    assert sum(g.stats.accepted for g in alone.values()) > 0
    assert all(g.stats.draft_forwards == 0 and g.stats.draft_seconds > 0 for g in alone.values())


def test_cost_per_drafted_token_is_near_zero(tiny_pair_dirs):
    backend = load_pair("prompt-lookup:4", tiny_pair_dirs[1], dtype="float32")
    assert backend.max_ngram == 4
    serving = backend.cost_profile(list(range(3, 40)), [4], (1, 4), min_passes=3, max_passes=5)
    profile = serving.at(1)
    # a batch of 4 looks up row by row: four lookups a drafting step; the verifier's costs its own at batch 4
    assert serving.at(4).t_draft == 4 * profile.t_draft and serving.at(4).batch_size == 4
    assert "prompt lookup" in serving.at(4).source and serving.at(4).spread["t_draft"] == profile.spread["t_draft"]
    # a lookup on ~100 tokens and its logit row: far below any real verifier step (0.24 s for the embedded
    # 1.5B on 2 idle cores), so c_rel is near 0 there; the tiny verifier here is itself sub-millisecond
    assert 0 < profile.t_draft < 0.02 and "t_draft" in profile.spread
    assert "prompt lookup" in profile.source and set(profile.t_verify) == {5}


def test_loading_names_and_refusals():
    assert backend_name("prompt-lookup", "v", verifier_url="http://x") == "sglang-prompt-lookup->v"
    assert backend_name("prompt-lookup", "v") == "prompt-lookup->v"
    with pytest.raises(ValueError, match="drafts without a model"):
        load_backend("prompt-lookup", "v", drafter_url="http://d", verifier_url="http://v")
    with pytest.raises(ValueError, match="not prompt lookup"):
        load_backend("prompt-lookup", "v", verifier_url="http://v", native_url="http://n")


@pytest.mark.slow
def test_tune_with_prompt_lookup_and_the_new_rules(tmp_path, tiny_pair_dirs):
    """One flag picks the drafter; `tune` takes the new rules, measures lookup's costs and exports them."""
    import yaml
    from typer.testing import CliRunner

    from relaxtune.cli import app
    from relaxtune.report.export import load_config

    from .tiny_task import write_tiny_task

    task = write_tiny_task(tmp_path)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"trials": 2, "n_drafts": [2], "limit": 4, "dtype": "float32", "stage_size": 2}))
    args = [
        "tune",
        "--config",
        str(cfg),
        "--task",
        task,
        "--drafter",
        "prompt-lookup",
        "--verifier",
        tiny_pair_dirs[1],
        "--methods",
        "typical,ears",
        "--output-dir",
        str(tmp_path / "runs"),
        "--mlflow-uri",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
    ]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    config = load_config(tmp_path / "runs" / "tiny_math.tuned.yaml")
    assert set(config.methods) == {"typical", "ears"} and config.drafter == "prompt-lookup"
    # measured, not the 0.2 default (near 0 against a real verifier; a tiny one runs in a fraction of a millisecond)
    from relaxtune.decoding.serving import ServingProfile

    profile = ServingProfile.from_dict(config.cost_profile)  # at every serving batch size the job resolved
    assert config.c_rel != 0.2 and all("prompt lookup" in p.source for p in profile.profiles.values())
    assert config.serving_batch_sizes == profile.batch_sizes and len(profile.batch_sizes) >= 3
    assert config.recommendation.batch_size == 1 and config.c_rel == pytest.approx(profile.at(1).c_rel, rel=1e-3)
