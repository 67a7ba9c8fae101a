"""The relaxation scope (``relaxtune.decoding.scope``): at scope "thinking" a round is
strict's bit for bit where no thinking token is in the state or the round, the rule's
bit for bit inside thinking, and a statistical check of both emitted distributions
(fixed seeds, chi-square); the exact per-position boundary (a ``</think>`` drafted
inside the round), TensorRT-LLM's round-start rule kept as the engine runs it, the
state carried across rounds, and the refusals."""

import pytest
import torch

from relaxtune.decoding.round import verify_round, verify_rounds
from relaxtune.decoding.sampling import SamplingParams, transform_logits
from relaxtune.decoding.scope import (
    ThinkingState,
    check_scope,
    inside_thinking,
    scopes_of,
    thinking_state,
)

from .conftest import P_FLOOR, chi2_pvalue

V = 8
BEGIN, END = 6, 7  # declared think ids inside the vocabulary


def _batch(seed, b, n, temperature=0.9, extra=False, greedy=False, think=False):
    """Rows ``p [B, N+1, V]``, ``q``, drafts, uniforms and logits; drafts avoid the
    thinking delimiters unless ``think``."""
    g = torch.Generator().manual_seed(seed)
    z_p = torch.randn(b, n + 1, V, generator=g) * 1.5
    z_q = z_p + torch.randn(b, n + 1, V, generator=g) * 0.8
    if not think:  # no delimiter is drafted or emitted: no thinking token in the round
        z_p[..., BEGIN:] = -torch.inf
        z_q[..., BEGIN:] = -torch.inf
    z_q = z_q if extra else z_q[:, :n]
    p = transform_logits(z_p, SamplingParams(temperature))
    if greedy:
        x = z_q[:, :n].argmax(-1)
        q = torch.nn.functional.one_hot(x, V).float()
    else:
        q = transform_logits(z_q, SamplingParams(temperature))
        x = torch.multinomial(q[:, :n].reshape(-1, V), 1, generator=g).view(b, n)
    return p, q, x, torch.rand(b, n + 1, generator=g), z_p, z_q


CASES = [  # method, knob, needs (extra drafter step, greedy drafts)
    ("always_accept", None, {}),
    ("ens", 0.4, {}),
    ("mentored", 0.7, {}),
    ("cactus", 1.0, {}),
    ("r_fuzzy", 0.3, {}),
    ("spec_casc_opt", 0.05, {}),
    ("spec_casc_tok", 0.35, {}),
    ("spec_cont_dec", 0.5, {"extra": True}),
    ("sglang_threshold", 0.3, {"greedy": True}),
    ("typical", 0.09, {}),
    ("ears", 0.3, {}),
    ("fly", {"fly_window_size": 2, "fly_entropy_threshold": 0.2, "fly_entropy_top_k": 3}, {}),
]


def _run(method, knob, rows, scope, state):
    p, q, x, u, z_p, z_q = rows
    return verify_rounds(p, q, x, method, knob, uniforms=u, z_p=z_p, z_q=z_q, temperature=0.9, state=state, scope=scope)


@pytest.mark.parametrize("method,knob,needs", CASES, ids=[c[0] for c in CASES])
def test_thinking_scope_is_strict_outside_and_the_rule_inside_bit_for_bit(method, knob, needs):
    b, n = 400, 4
    rows = _batch(3, b, n, **needs)
    p, q, x, u, z_p, z_q = rows
    strict = verify_rounds(p, q, x, "strict", uniforms=u, z_p=z_p, z_q=z_q, temperature=0.9)
    rule = verify_rounds(p, q, x, method, knob, uniforms=u, z_p=z_p, z_q=z_q, temperature=0.9)
    assert not torch.equal(rule.tokens, strict.tokens)  # the rule relaxes on these rows
    outside = _run(method, knob, rows, "thinking", thinking_state([[1, 2]] * b, BEGIN, END))
    assert torch.equal(outside.tokens, strict.tokens) and torch.equal(outside.accepted, strict.accepted)
    assert not outside.state.thinking.any()
    inside = _run(method, knob, rows, "thinking", thinking_state([[1, BEGIN]] * b, BEGIN, END))
    assert torch.equal(inside.tokens, rule.tokens) and torch.equal(inside.accepted, rule.accepted)
    assert inside.state.thinking.all()


def _first_tokens(scope_inside: bool, rounds: int, seed: int) -> torch.Tensor:
    """The first emitted token of ``rounds`` one-draft rounds of mentored (alpha 0.7)
    on one fixed pair of rows, inside or outside thinking."""
    g = torch.Generator().manual_seed(seed)
    p1 = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.10, 0.05, 0.0, 0.0])
    q1 = torch.tensor([0.05, 0.10, 0.15, 0.30, 0.25, 0.15, 0.0, 0.0])
    p = p1.expand(rounds, 2, V).contiguous()
    q = q1.expand(rounds, 1, V).contiguous()
    x = torch.multinomial(q1, rounds, replacement=True, generator=g).view(rounds, 1)
    state = ThinkingState(torch.full((rounds,), scope_inside), BEGIN, END)
    out = verify_rounds(p, q, x, "mentored", 0.7, generator=g, state=state, scope="thinking")
    return out.tokens[:, 0], p1, q1


def test_thinking_scope_emits_strict_outside_and_the_rule_inside_by_chi_square():
    alpha = 0.7
    y_out, p1, q1 = _first_tokens(False, 40_000, 11)
    y_in, _, _ = _first_tokens(True, 40_000, 12)
    accept = torch.minimum(q1, p1 / (1 - alpha))  # mentored's closed form, one position
    resid = (p1 - q1).clamp_min(0)
    rule = accept + (1 - accept.sum()) * resid / resid.sum()
    assert chi2_pvalue(y_out, p1) > P_FLOOR  # strict emits p exactly
    assert chi2_pvalue(y_in, rule) > P_FLOOR
    assert chi2_pvalue(y_out, rule) < 1e-12 and chi2_pvalue(y_in, p1) < 1e-12  # the two differ: the test has power


def test_a_think_end_drafted_inside_the_round_ends_the_relaxation_at_the_next_position():
    p = torch.tensor([[0.4, 0.3, 0.0, 0.1, 0.1, 0.0, 0.05, 0.05]]).expand(4, V)  # p(2) = 0: strict rejects 2
    q = torch.full((3, V), 1.0 / V)
    u = torch.full((4,), 0.3)
    inside = ThinkingState(torch.tensor([True]), BEGIN, END)
    run = lambda x, st: verify_round(p, q, torch.tensor(x), "always_accept", uniforms=u, state=st, scope="thinking")  # noqa: E731
    assert run([1, 2, 2], inside).accepted == 3  # all inside: always_accept takes every draft
    ended = run([END, 2, 2], inside)  # </think> itself is decided inside, then strict: p(2) = 0 rejects
    assert ended.accepted == 1 and ended.tokens[0] == END and ended.tokens[1] != 2
    assert not bool(ended.state.thinking[0])
    outside = ThinkingState(torch.tensor([False]), BEGIN, END)
    assert run([2, 2, 2], outside).accepted == 0  # strict from the first position: p(2) = 0
    opened = run([BEGIN, 2, 2], outside)  # <think> drafted in the answer (p/q = 0.4 > u: accepted), then relaxed
    assert opened.accepted == 3 and bool(opened.state.thinking[0])


def test_inside_thinking_marks_each_position_from_the_state_and_the_drafts_before_it():
    st = ThinkingState(torch.tensor([True, False, True, False]), BEGIN, END)
    x = torch.tensor([[1, END, 2], [BEGIN, 1, END], [1, 2, 3], [END, BEGIN, 1]])
    assert inside_thinking(st, x).tolist() == [
        [True, True, False, False],
        [False, True, True, False],
        [True, True, True, True],
        [False, False, True, True],
    ]
    assert thinking_state([[1, BEGIN], [BEGIN, 3, END], [1, 2], [END, BEGIN, 5]], BEGIN, END).thinking.tolist() == [
        True,
        False,
        False,
        True,
    ]


def test_trtllm_keeps_its_round_start_rule_at_scope_thinking():
    g = torch.Generator().manual_seed(5)
    b, n = 300, 4
    z_p = torch.randn(b, n + 1, V, generator=g)
    z_p[:, 1:, BEGIN:] = -torch.inf  # no delimiter after the first position
    z_p[:, 0, END] = z_p[:, 0].amax(-1) + 1.0  # </think> first: the verifier's argmax at position 0
    x = torch.topk(z_p[:, :n], 2, dim=-1).indices[..., 1]  # the runner-up: relaxed only
    x[:, 0] = END
    p = transform_logits(z_p, SamplingParams(0.0))
    q = torch.nn.functional.one_hot(x, V).float()
    knobs = {"relaxed_topk": 10, "relaxed_delta": 0.9}
    st = ThinkingState(torch.ones(b, dtype=torch.bool), BEGIN, END)
    kw = dict(z_p=z_p, temperature=0.0, state=st, generator=torch.Generator().manual_seed(0))
    native = verify_rounds(p, q, x, "trtllm_relaxed", knobs, **kw)
    scoped = verify_rounds(p, q, x, "trtllm_relaxed", knobs, scope="thinking", **kw)
    assert torch.equal(native.tokens, scoped.tokens)
    assert float(scoped.accepted.float().mean()) > 1.5  # relaxed past the drafted </think>, as the engine
    assert not scoped.state.thinking.any()  # the state left thinking after the round


def test_scope_refusals():
    p, q, x, u, z_p, z_q = _batch(0, 2, 3)
    with pytest.raises(ValueError, match="scope must be one of all, thinking"):
        verify_rounds(p, q, x, "ens", 0.3, uniforms=u, scope="answer")
    with pytest.raises(ValueError, match="scope thinking needs state= a ThinkingState of 2 sequences"):
        verify_rounds(p, q, x, "ens", 0.3, uniforms=u, scope="thinking")
    with pytest.raises(ValueError, match="--relaxation-scope thinking: task humaneval does not think"):
        check_scope("thinking", "humaneval", False)
    with pytest.raises(ValueError, match="--relaxation-scope both: task gsm8k_mini does not think"):
        check_scope("both", "gsm8k_mini", False)
    check_scope("all", "humaneval", False)
    check_scope("both", "aime", True)
    assert scopes_of("both") == ("all", "thinking") and scopes_of("thinking") == ("thinking",)
    with pytest.raises(ValueError, match="--relaxation-scope 'x'"):
        scopes_of("x")


# ------------------------------------------------------------------ the engine's rows


def _engine_view(out):
    return {r.key: (g.token_ids, g.stats.rounds, g.stats.accepted) for r, g in out}


@pytest.mark.slow  # about 9 s on a loaded CPU
def test_the_engine_scopes_rows_by_their_prompt_and_their_tokens():
    """On the tiny pair (no <think> token: declared ids), batched rows at scope
    "thinking" are strict's token for token when no declared delimiter occurs, the
    rule's when every prompt opened thinking and nothing closes it, and a mix of both
    in one batch is each row's own."""
    from relaxtune.decoding.sampling import SamplingParams as SP
    from relaxtune.engine.batch import Request, generate_batch

    from .tiny_models import tiny_pair

    backend = tiny_pair(noise=0.6)
    absent = (10_000, 10_001)  # ids no token has: never inside
    opened = (9, 10_001)  # 9 ends the prompts that open thinking; nothing closes it
    prompts = {i: [(5 * i + 3 * j) % 64 for j in range(4 + i)] for i in range(4)}
    req = lambda think: [  # noqa: E731
        Request(prompts[i] + ([9] if think and i % 2 == 0 else []), seed=40 + i, max_new_tokens=16, key=i)
        for i in prompts
    ]
    kw = dict(n_draft=3, sampling=SP(temperature=0.8), batch_size=4)
    strict = _engine_view(generate_batch(backend, req(False), method="strict", **kw))
    rule_all = _engine_view(generate_batch(backend, req(True), method="mentored", knob=0.9, **kw))
    strict_think = _engine_view(generate_batch(backend, req(True), method="strict", **kw))
    scoped = dict(method="mentored", knob=0.9, scope="thinking", **kw)
    outside = _engine_view(generate_batch(backend, req(False), think_ids=absent, **scoped))
    assert outside == strict
    mixed = _engine_view(generate_batch(backend, req(True), think_ids=opened, **scoped))
    assert {k: v for k, v in mixed.items() if k % 2 == 0} == {k: v for k, v in rule_all.items() if k % 2 == 0}
    assert {k: v for k, v in mixed.items() if k % 2} == {k: v for k, v in strict_think.items() if k % 2}
    assert sum(v[2] for v in rule_all.values()) > sum(v[2] for v in strict_think.values())  # the rule relaxed
    with pytest.raises(ValueError, match="needs the model's <think> and </think> token ids"):
        next(generate_batch(backend, req(False), method="mentored", knob=0.9, scope="thinking", **kw))


# ------------------------------------------------------------------ the search dimension


@pytest.mark.slow  # about 9 s on a loaded CPU
def test_the_search_draws_scope_as_a_trial_parameter_and_records_it(tmp_path):
    """``--relaxation-scope both``: each trial carries its scope, evaluates at it (the
    records' configuration) and stores it in its metrics; the studies are named for it.
    Scope ``all`` leaves the trials' parameters and the study names as they were."""
    from relaxtune.tune.pareto import point_label
    from relaxtune.tune.tuning import Tuner, TuneSettings

    from .synthetic import PROBLEMS, SPEC, Synthetic

    class Pair:
        name = "synthetic-pair"

    def run(setting):
        synthetic, seen = Synthetic(cliff=1.0), []

        def evaluate_fn(spec, backend, config, **kw):
            seen.append((config.method, config.knob, config.scope))
            return synthetic(spec, backend, config, **kw)

        fields = dict(task="synthetic", methods=["cactus"], n_drafts=[4], trials=6, stage_size=200)
        settings = TuneSettings(**fields, output_dir=str(tmp_path / setting), c_rel=0.2, relaxation_scope=setting)
        tuner = Tuner(settings, SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=evaluate_fn, progress=False)
        return tuner.tune_method("cactus"), seen

    outcome, seen = run("both")
    assert outcome.study.study_name == "synthetic-v2__cactus__synthetic-pair__scope-both"
    trials = [t for t in outcome.study.trials if t.state.name == "COMPLETE"]
    scopes = {t.params["scope"] for t in trials}
    assert scopes == {"all", "thinking"}
    for t in trials:
        assert t.user_attrs["metrics"]["scope"] == t.params["scope"]
        assert ("cactus", t.params["knob"], t.params["scope"]) in seen
        label = point_label("cactus", None, t.params["knob"], 4, t.params)  # logs, MLflow run names, figures
        assert label == f"cactus delta={t.params['knob']:.3g} N=4" + (" thinking" if t.params["scope"] != "all" else "")
    assert {s for m, _, s in seen if m == "strict"} == {"all"}
    fixed, seen = run("thinking")
    assert {t.params["scope"] for t in fixed.study.trials} == {"thinking"}
    assert {s for m, _, s in seen if m != "strict"} == {"thinking"}
    plain, _ = run("all")
    assert plain.study.study_name == "synthetic-v2__cactus__synthetic-pair"
    assert all(set(t.params) == {"n_draft", "knob"} for t in plain.study.trials)
    assert all(t.user_attrs["metrics"]["scope"] == "all" for t in plain.study.trials if t.state.name == "COMPLETE")


# ------------------------------------------------------------------ the export


def test_deploy_blocks_at_scope_thinking_refuse_engines_that_relax_everywhere():
    from relaxtune.report.deploy import deploy_blocks

    s = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    g = {"temperature": 0.0, "top_p": 1.0, "top_k": None}

    def at(method, knob, sampling, scope):
        return deploy_blocks(method, knob, 4, sampling, "d", "v", "float32", "hf", scope)

    ens = at("ens", 0.2, s, "thinking")
    assert ens == {
        "transformers": {
            "engine": "transformers 5.14.0",
            "refused": "ens was measured relaxing inside <think>...</think> only (scope thinking); transformers "
            "applies it at every position: only TensorRT-LLM's relaxed acceptance is thinking-scoped",
        }
    }
    assert "generate_kwargs" in at("ens", 0.2, s, "all")["transformers"]
    knobs = {"relaxed_topk": 10, "relaxed_delta": 0.6}
    assert at("trtllm_relaxed", knobs, g, "thinking") == at("trtllm_relaxed", knobs, g, "all")  # keyed on thinking
    assert at("ens", 0.0, s, "thinking") == at("ens", 0.0, s, "all")  # a strict point: every engine, lossless
    assert at("cactus", 0.25, s, "thinking") == at("cactus", 0.25, s, "all")  # no engine: the one line


# ------------------------------------------------------------------ evaluations


def test_evaluate_refuses_a_thinking_scope_without_a_thinking_task_or_thinking_tokens(tiny_backend, tmp_path):
    from relaxtune.tune.evaluation import evaluate
    from relaxtune.tune.point_records import DecodeConfig

    from .test_evaluation import tiny_task

    config = DecodeConfig("ens", 0.3, 2, scope="thinking")
    assert config.label == "ens-0.3__N2__seed0__thinking"
    with pytest.raises(ValueError, match="--relaxation-scope thinking: task tiny_math does not think"):
        evaluate(tiny_task(), tiny_backend, config, output_dir=tmp_path, limit=1, progress=False)
    with pytest.raises(ValueError, match="its tokenizer has no single <think> and </think> token"):
        evaluate(tiny_task(thinking_budget=4), tiny_backend, config, output_dir=tmp_path, limit=1, progress=False)
    assert not list(tmp_path.iterdir())  # refused before anything is written


def test_responses_at_scope_thinking_take_the_think_ids_from_the_tokenizer():
    """A pair whose tokenizer has <think> and </think> as tokens: the task's responses
    run at scope thinking (ids found), and the one-hot scripted pair gives strict's text."""
    from relaxtune.engine.responses import generate_responses, think_token_ids
    from relaxtune.tune.point_records import DecodeConfig

    from .scripted import ScriptedBackend
    from .test_evaluation import tiny_task

    script = ["<think>", "a", "b", "</think>", "c", "d"]
    backend = ScriptedBackend(script, extra=("\n",))
    assert think_token_ids(backend.tokenizer) == (backend.vocab.index("<think>"), backend.vocab.index("</think>"))
    spec = tiny_task(thinking_budget=8, max_new_tokens=12)
    items = [(k, [0] * (k + 1), 5) for k in range(3)]
    scoped = dict(generate_responses(backend, spec, DecodeConfig("ens", 0.3, 2, scope="thinking"), items))
    strict = dict(generate_responses(backend, spec, DecodeConfig("strict", None, 2), items))
    assert {k: g.token_ids for k, g in scoped.items()} == {k: g.token_ids for k, g in strict.items()}
    assert scoped[0].text.startswith("<think>ab</think>cd")


def test_the_job_refuses_a_thinking_scope_on_a_task_that_does_not_think_before_the_pair_loads(tmp_path):
    """The flow's and the CLI's entry (``run_tune_job``): refused by name, no model, no file."""
    from relaxtune.job.run import run_tune_job
    from relaxtune.report.reexport import JobError
    from relaxtune.testing.synthetic import write_task
    from relaxtune.tune.settings import TuneSettings

    class NoPair:
        def __getattr__(self, name):
            raise AssertionError(f"the pair was used ({name})")

    task = write_task(tmp_path / "task", 8, "plain")
    s = TuneSettings(task=task, methods=["ens"], output_dir=str(tmp_path / "runs"), relaxation_scope="both")
    with pytest.raises(JobError, match="--relaxation-scope both: task plain does not think"):
        run_tune_job(s, NoPair(), progress=False, log=lambda m: None, track=False)
    assert not (tmp_path / "runs").exists()
