"""Evaluating a configuration on a tiny local task with the tiny model pair."""

import json
from pathlib import Path

import pytest

from relaxtune.backends.rows import RowByRow
from relaxtune.engine.responses import generate_responses
from relaxtune.tasks.spec import TaskSpec, load_problems
from relaxtune.tune.evaluation import evaluate, generate_response, opens_thinking, sample_seed
from relaxtune.tune.point_records import DecodeConfig

from .scripted import ScriptedBackend

FIXTURES = Path(__file__).parent / "fixtures"


def tiny_task(**over) -> TaskSpec:
    raw = dict(
        name="tiny_math",
        version=3,
        dataset={"path": "json", "data_files": str(FIXTURES / "tiny_math.jsonl")},
        fields={"question": "question", "answer": "answer"},
        prompt={"template": "{question} = ?"},
        grader={"kind": "math"},
        sampling={"temperature": 0.8, "top_p": 1.0, "top_k": None},
        max_new_tokens=12,
    )
    raw.update(over)
    return TaskSpec(**raw)


def test_records_results_and_resume(tiny_backend, tmp_path):
    spec = tiny_task(repeats=2)
    config = DecodeConfig("cactus", 1.0, 3, seed=5)
    first = evaluate(spec, tiny_backend, config, output_dir=tmp_path, limit=2, progress=False)
    assert first.n == 4 and first.failed == 0
    lines = first.path.read_text().splitlines()
    assert len(lines) == 4
    rec = next(r for r in map(json.loads, lines) if (r["problem_id"], r["repeat"]) == ("0", 0))
    for key in (
        "task",
        "version",
        "problem_id",
        "repeat",
        "seed",
        "prompt_hash",
        "output",
        "extracted",
        "verdict",
        "finish_reason",
        "prompt_tokens",
        "response_tokens",
        "stats",
    ):
        assert key in rec, key
    assert rec["task"] == "tiny_math" and rec["version"] == 3 and rec["seed"] == sample_seed(5, "0", 0)
    assert rec["stats"]["emitted"] == rec["response_tokens"]
    assert rec["stats"]["rounds"] <= rec["stats"]["emitted"] <= rec["stats"]["accepted"] + rec["stats"]["rounds"]
    assert first.path.parts[-3] == "tiny_math-v3"
    # a restart with more problems keeps the finished samples and only runs the new ones
    second = evaluate(spec, tiny_backend, config, output_dir=tmp_path, limit=4, progress=False)
    assert second.n == 8
    lines2 = second.path.read_text().splitlines()
    assert lines2[:4] == lines and len(lines2) == 8
    assert 0 <= second.ci_low <= second.accuracy <= second.ci_high <= 1
    assert second.l_accept > 0 and second.mean_length > 0


def test_an_edited_task_under_the_same_version_is_refused(tiny_backend, tmp_path):
    config = DecodeConfig("strict", None, 2)
    evaluate(tiny_task(), tiny_backend, config, output_dir=tmp_path, limit=1, progress=False)
    evaluate(tiny_task(description="reworded"), tiny_backend, config, output_dir=tmp_path, limit=1, progress=False)
    with pytest.raises(ValueError, match=r"tiny_math v3 changed .*\(max_new_tokens, prompt\): bump `version:`"):
        evaluate(
            tiny_task(max_new_tokens=20, prompt={"template": "{question}?"}),
            tiny_backend,
            config,
            output_dir=tmp_path,
            limit=1,
            progress=False,
        )
    bumped = evaluate(
        tiny_task(version=4, max_new_tokens=20), tiny_backend, config, output_dir=tmp_path, limit=1, progress=False
    )
    assert bumped.path.parts[-3] == "tiny_math-v4" and bumped.n == 1
    # a field added by a later relaxtune (absent from the stored spec, at its default) is no change
    stored = bumped.path.parent.parent / "spec.json"
    raw = json.loads(stored.read_text())
    del raw["shuffle_seed"]
    stored.write_text(json.dumps(raw))
    evaluate(
        tiny_task(version=4, max_new_tokens=20), tiny_backend, config, output_dir=tmp_path, limit=1, progress=False
    )


def test_same_seeds_across_methods_are_paired(tiny_backend, tmp_path):
    spec = tiny_task()
    strict = evaluate(spec, tiny_backend, DecodeConfig("strict", None, 3), output_dir=tmp_path, limit=3, progress=False)
    relaxed = evaluate(
        spec, tiny_backend, DecodeConfig("mentored", 0.0, 3), output_dir=tmp_path, limit=3, progress=False
    )
    # mentored at its strict point with the same seeds reproduces strict sample for sample
    assert [r["output"] for r in strict.records] == [r["output"] for r in relaxed.records]
    assert strict.path != relaxed.path


class FailingBackend:
    """Wraps a backend and fails every second sequence it starts (one at a time
    or joining a batch); ``batched=False`` runs batches of one."""

    def __init__(self, inner, batched: bool):
        self.inner, self.calls = inner, 0
        self.name, self.tokenizer = "failing", inner.tokenizer
        self.batch_size = inner.batch_size if batched else 1

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def _count(self):
        self.calls += 1
        if self.calls % 2 == 0:
            raise ConnectionError("server went away")

    def start(self, prompt_ids):
        self._count()
        return self.inner.start(prompt_ids)

    def join(self, batch, prompts):
        for _ in prompts:
            self._count()
        return self.inner.join(batch, prompts)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
def test_failed_generations_are_recorded_not_counted(tiny_backend, tmp_path, batched):
    result = evaluate(
        tiny_task(),
        FailingBackend(tiny_backend, batched),
        DecodeConfig("strict"),
        output_dir=tmp_path,
        limit=4,
        progress=False,
    )
    assert result.n == 2 and result.failed == 2
    failed = [r for r in result.records if r["failed"]]
    assert all(r["verdict"] == "generation_error" and "server went away" in r["error"] for r in failed)
    # the batch went on around the failures: the samples that joined equal a run without them
    clean = evaluate(
        tiny_task(), tiny_backend, DecodeConfig("strict"), output_dir=tmp_path / "clean", limit=4, progress=False
    )
    ok = {r["problem_id"]: r["output"] for r in result.records if not r["failed"]}
    assert ok == {r["problem_id"]: r["output"] for r in clean.records if r["problem_id"] in ok}


def test_thinking_budget_forces_the_answer(tiny_backend):
    spec = tiny_task(thinking_budget=4, max_new_tokens=40, answer_now="\nanswer now.\n")
    problem = load_problems(spec, limit=1)[0]
    ids = tiny_backend.tokenizer.encode(problem.prompt)
    gen = generate_response(tiny_backend, spec, ids, DecodeConfig("strict", None, 2), seed=1)
    if "</think>" in gen.text[: len(gen.text) - len("\nanswer now.\n</think>\n\n")]:
        pytest.skip("the random model closed its thinking by itself")
    forced = "\nanswer now.\n</think>\n\n"  # 23 one-character tokens
    forced_ids = tiny_backend.tokenizer.encode(forced, add_special_tokens=False)
    assert gen.token_ids[4 : 4 + len(forced_ids)] == forced_ids  # right after the 4-token thinking budget
    assert gen.text.index(forced) == len(tiny_backend.tokenizer.decode(gen.token_ids[:4]))
    assert len(gen.token_ids) == gen.stats.response_tokens
    assert 4 + 23 < len(gen.token_ids) <= 40  # generation went on after the forced text, within the total


def test_length_cut_responses_are_graded_as_truncated(tiny_backend, tmp_path, monkeypatch):
    import relaxtune.tune.evaluation as evaluation

    seen = {}
    real = evaluation.grade

    def spy(kind, text, gold, **opts):
        seen[text] = opts["truncated"]
        return real(kind, text, gold, **opts)

    monkeypatch.setattr(evaluation, "grade", spy)
    spec = tiny_task(max_new_tokens=8, repeats=3, stop=["e"])  # some responses stop, some are cut
    result = evaluate(spec, tiny_backend, DecodeConfig("strict", None, 2), output_dir=tmp_path, limit=4, progress=False)
    cut = {r["output"]: r["finish_reason"] == "length" for r in result.records}
    assert seen == cut and any(cut.values()) and not all(cut.values())  # only cut answers go in as truncated


def test_refuses_greedy_collapse_before_generating(tiny_backend, tmp_path):
    with pytest.raises(ValueError, match="collapses to strict"):
        evaluate(
            tiny_task(sampling={"temperature": 0.0}),
            tiny_backend,
            DecodeConfig("cactus", 1.0),
            output_dir=tmp_path,
            progress=False,
        )


class _Tokens:
    """A tokenizer whose ids are words."""

    words = {1: "<|user|>Solve it", 2: "<|assistant|>", 3: "<think>", 4: "\n", 5: "</think>"}

    def decode(self, ids):
        return "".join(self.words[i] for i in ids)


def test_a_prompt_that_opens_thinking_is_seen():
    tok = _Tokens()
    assert opens_thinking(tok, [1, 2, 3, 4])  # DeepSeek-R1 style: the response starts inside the thinking
    assert not opens_thinking(tok, [1, 2, 3, 4, 5, 4])  # Qwen3 with thinking off: an empty block, closed
    assert not opens_thinking(tok, [1, 2])  # the model opens its own block, if any
    assert not opens_thinking(tok, [3] + [4] * 20 + [1, 2])  # a <think> far back in the question is not the template's


class OneByOne(RowByRow):
    """The in-process pair's one-sequence helpers, batched row by row in threads (as the
    SGLang client: ``relaxtune.backends.rows``)."""

    concurrent_rows = True
    point_mass_drafts = False
    native = None

    def __init__(self, inner):
        self.inner, self.name, self.tokenizer = inner, inner.name, inner.tokenizer
        self.vocab_size, self.eos_token_ids, self.batch_size = inner.vocab_size, inner.eos_token_ids, 4
        self.start, self.draft, self.score, self.commit = inner.start, inner.draft, inner.score, inner.commit
        self.decode = inner.decode


@pytest.mark.parametrize("config", [DecodeConfig("strict", None, 3, seed=2), DecodeConfig("spec_cont_dec", 0.5, 2)])
def test_batched_evaluation_equals_one_by_one(tiny_backend, tmp_path, config):
    # thinking with a budget: some responses get the forced answer and re-join the batch as continuations
    spec = tiny_task(repeats=3, thinking_budget=5, max_new_tokens=30, answer_now="\nnow.\n", stop=["e"])
    results = {}
    for label, backend, size in [
        ("threads", OneByOne(tiny_backend), None),
        ("batch1", tiny_backend, 1),
        ("batch8", tiny_backend, 8),
    ]:
        result = evaluate(spec, backend, config, output_dir=tmp_path / label, limit=4, progress=False, batch_size=size)
        results[label] = {
            (r["problem_id"], r["repeat"]): (
                r["output"],
                r["finish_reason"],
                r["response_tokens"],
                r["stats"]["rounds"],
                r["stats"]["accepted"],
            )
            for r in result.records
        }
    assert results["threads"] == results["batch1"] == results["batch8"] and len(results["batch8"]) == 12
    assert any("</think>" in out[0] for out in results["batch8"].values())  # the forced answer happened


@pytest.mark.parametrize("batched", [False, True])
def test_the_forced_answer_then_stops_after_think(batched):
    script = ["<think>", "a", "|", "b", "c", "|", "d", "e", "f", "g"]
    backend = ScriptedBackend(script, extra=("\n", "N", "O", "W", "</think>"), batch_size=3)
    spec = tiny_task(thinking_budget=4, max_new_tokens=24, answer_now="\nNOW\n", stop=["|"])
    config = DecodeConfig("strict", None, 2)
    if batched:
        items = [(k, [0] * (k + 1), 5) for k in range(3)]
        out = dict(generate_responses(backend, spec, config, items))
        assert out[0].token_ids == out[1].token_ids == out[2].token_ids
        gen = out[0]
    else:
        gen = generate_response(backend, spec, [0], config, seed=5)
    forced = "\nNOW\n</think>\n\n"
    forced_ids = backend.tokenizer.encode(forced)
    # the first 4 tokens think (the stop inside them does not fire), the answer is forced, then the
    # continuation generates the script again and its first "|" ends the response
    assert gen.text == "<think>a|b" + forced + "<think>a"
    first, rest = [backend.vocab.index(t) for t in script[:4]], [backend.vocab.index(t) for t in script[:3]]
    assert len(forced_ids) == 8 and gen.token_ids == first + forced_ids + rest
    assert gen.stats.finish_reason == "stop" and gen.stats.response_tokens == 4 + 8 + 3


@pytest.mark.parametrize("batched", [False, True])
def test_a_blank_line_after_the_forced_answer_does_not_end_it(batched):
    # stops include "\n\n"; the continuation after the forced </think> starts with a blank line
    script = ["\n\n", "x", "\n\n", "y", "z", "w"]
    backend = ScriptedBackend(script, extra=("\n", "N", "O", "W", "</think>"), batch_size=3)
    spec = tiny_task(thinking_budget=4, max_new_tokens=24, answer_now="\nNOW\n", stop=["\n\n"])
    config = DecodeConfig("strict", None, 2)
    if batched:
        out = dict(generate_responses(backend, spec, config, [(k, [0] * (k + 1), 5) for k in range(3)]))
        assert out[0].token_ids == out[1].token_ids == out[2].token_ids
        gen = out[0]
    else:
        gen = generate_response(backend, spec, [0], config, seed=5)
    forced = "\nNOW\n</think>\n\n"
    forced_ids = backend.tokenizer.encode(forced)
    ids = [backend.vocab.index(t) for t in script]
    # the thinking (4 tokens) holds "\n\n" too and is never cut; the answer "x" ends at its next blank line
    assert gen.text == "\n\nx\n\ny" + forced + "\n\nx"
    assert gen.token_ids == ids[:4] + forced_ids + ids[:3]
    assert gen.stats.finish_reason == "stop" and gen.stats.response_tokens == 4 + len(forced_ids) + 3
