"""Task specs: every shipped spec loads from local fixtures; GPQA shuffling; validation."""

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from relaxtune.cli import app
from relaxtune.tasks.spec import TaskSpec, list_tasks, load_problems, load_task

FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED = ["aime24", "aime25", "gpqa_diamond", "gsm8k", "humaneval", "lcb_lite_v6", "math500"]
LOCAL = {
    "aime24": "aime.jsonl",
    "aime25": "aime.jsonl",
    "math500": "math500.jsonl",
    "gsm8k": "gsm8k.jsonl",
    "gpqa_diamond": "gpqa.jsonl",
    "lcb_lite_v6": "lcb.jsonl",
}


def _local(name: str) -> TaskSpec:
    """The shipped spec, pointed at our fixture file (as an air-gapped user would)."""
    raw = yaml.safe_load(Path(load_task(name).source_file).read_text())
    raw["dataset"] = {"path": "json", "data_files": str(FIXTURES / LOCAL[name])}
    return TaskSpec(**raw)


def test_every_paper_task_is_shipped():
    assert set(SHIPPED) <= set(list_tasks())
    for name in SHIPPED:
        spec = load_task(name)
        assert spec.version >= 1 and spec.sampling.params().temperature == 0.6


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_shipped_specs_load_from_local_files(name):
    problems = load_problems(_local(name))
    assert problems and all(p.prompt and p.gold is not None for p in problems)
    first = problems[0]
    if name.startswith("aime"):
        assert first.id == "1" and first.gold == "2" and "Find 1 + 1." in first.prompt and r"\boxed{}" in first.prompt
    if name == "gsm8k":
        assert [p.gold for p in problems] == ["7", "1000"]
    if name == "math500":
        assert first.gold == r"\dfrac{9}{7}" and first.id == "test/algebra/1.json"
    if name == "gpqa_diamond":
        right = f"({first.gold['answer']}) right"
        assert right in first.prompt and first.prompt.count("wrong") == 3
        assert first.gold["letters"] == "ABCD" and first.gold["format"] == "ANSWER:"  # read from the prompt
    if name == "lcb_lite_v6":
        assert first.gold["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]
        assert problems[1].gold["fn_name"] == "addK" and "class Solution" in problems[1].prompt


def test_humaneval_comes_from_the_package_offline():
    problems = load_problems(load_task("humaneval"), limit=3)
    assert [p.id for p in problems] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert set(problems[0].gold) == {"prompt", "test", "entry_point"} and "```python" in problems[0].prompt


def test_gpqa_shuffle_is_fixed_and_uniform(tmp_path):
    rows = [
        {
            "Record ID": f"q{i}",
            "Question": "?",
            "Correct Answer": "right",
            "Incorrect Answer 1": "w1",
            "Incorrect Answer 2": "w2",
            "Incorrect Answer 3": "w3",
        }
        for i in range(800)
    ]
    data = tmp_path / "g.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    raw = yaml.safe_load(Path(load_task("gpqa_diamond").source_file).read_text())
    raw["dataset"] = {"path": "json", "data_files": str(data)}
    problems = load_problems(TaskSpec(**raw))
    assert all(f"({p.gold['answer']}) right" in p.prompt for p in problems)  # the gold letter is where it landed
    first = [p.gold["answer"] for p in problems]
    again = [p.gold["answer"] for p in load_problems(TaskSpec(**raw))]
    assert first == again
    counts = Counter(first)
    assert stats.chisquare([counts[c] for c in "ABCD"]).pvalue > 1e-3
    raw["shuffle_seed"] = 1
    assert [p.gold["answer"] for p in load_problems(TaskSpec(**raw))] != first


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda r: r.pop("grader"), "grader"),
        (lambda r: r.update(colour="blue"), "colour"),
        (lambda r: r.update(version=0), "version"),
        (lambda r: r["grader"].update(kind="essay"), "kind"),
        (lambda r: r.update(thinking_budget=5000, max_new_tokens=4000), "thinking_budget"),
        (lambda r: r["sampling"].update(top_p=0.0), "top_p"),
        (lambda r: r.update(stop=["\n\n", ""]), "empty stop string"),
        (lambda r: r.update(stop=["</think>"]), "thinking marker"),
        (lambda r: r.update(stop=["Answer:", "<think>"]), "thinking marker"),
        (lambda r: r.update(stop=["x</think>y"]), "thinking marker"),
        (lambda r: r.update(stop=["</think>"], thinking_budget=None), "thinking marker"),  # prompt.thinking alone
    ],
)
def test_invalid_specs_are_explained(tmp_path, change, match):
    raw = yaml.safe_load(Path(load_task("gsm8k").source_file).read_text())
    change(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=match):
        load_task(path)


def test_missing_task_and_missing_data_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no task 'nope'.*humaneval"):
        load_task("nope")
    with pytest.raises(FileNotFoundError, match="task file './missing.yaml' not found"):
        load_task("./missing.yaml")
    raw = yaml.safe_load(Path(load_task("gsm8k").source_file).read_text())
    raw["dataset"] = {"path": "json", "data_files": str(tmp_path / "absent.jsonl")}
    with pytest.raises(FileNotFoundError, match="absent.jsonl"):
        load_problems(TaskSpec(**raw))


def test_cli_lists_and_validates(tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["tasks"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and all(name in out.output for name in SHIPPED)
    good = tmp_path / "mine.yaml"
    raw = yaml.safe_load(Path(load_task("gsm8k").source_file).read_text())
    raw["dataset"] = {"path": "json", "data_files": str(FIXTURES / "gsm8k.jsonl")}
    good.write_text(yaml.safe_dump(raw))
    out = runner.invoke(app, ["tasks", "validate", str(good), "--load"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "valid" in out.output and "Tom has 3 apples" in out.output
    raw["grader"]["kind"] = "essay"
    good.write_text(yaml.safe_dump(raw))
    out = runner.invoke(app, ["tasks", "validate", str(good)], env={"COLUMNS": "200"})
    assert out.exit_code == 1 and "invalid" in out.output


def test_special_judge_problems_are_excluded_and_listed(tmp_path, caplog):
    """LiveCodeBench problems that accept several outputs are left out for every method, by
    statement or by the ERRATA list (id or title), and reported."""

    def row(qid, title, statement):
        return {
            "question_id": qid,
            "question_title": title,
            "question_content": statement,
            "starter_code": "",
            "public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
            "private_test_cases": "",
            "metadata": "{}",
        }

    rows = [
        row("p1", "Plain", "Print the sum."),
        row("p2", "Any", "Print a valid coloring. If there are multiple solutions, print any of them."),
        row("p3", "Order", "Return the indices. You may return the answer in any order."),
        row("abc311_c", "Find it!", "Print the cycle."),
        row("3194", "Find Words Containing Character", "Return an array of indices."),
        row("p6", "Edges", "The edges are given in any order. Print the number of components."),
    ]
    data = tmp_path / "lcb.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    spec = _local("lcb_lite_v6")
    spec.dataset.data_files = str(data)
    problems = load_problems(spec)
    assert [p.id for p in problems] == ["p1", "p6"]
    assert set(problems.excluded) == {"p2", "p3", "abc311_c", "3194"}
    assert "ERRATA" in problems.excluded["abc311_c"] and "any of them" in problems.excluded["p2"]
    assert "4 problems excluded" in caplog.text
    assert [p.id for p in load_problems(spec, limit=2)] == ["p1", "p6"]  # the limit counts gradable problems
    spec.grader.exclude_special_judge, spec.grader.exclude = False, {}
    assert len(load_problems(spec)) == 6


def test_choice_gold_carries_the_letters_and_the_prompts_answer_format(tmp_path):
    rows = [{"id": "q0", "q": "?", **{f"c{i}": f"choice {i}" for i in range(6)}}]
    data = tmp_path / "mc.jsonl"
    data.write_text(json.dumps(rows[0]))
    spec = TaskSpec(
        name="mc6",
        version=1,
        dataset={"path": "json", "data_files": str(data)},
        fields={"id": "id", "question": "q", "answer": None, "choices": [f"c{i}" for i in range(6)]},
        prompt={"template": "{q}\n{choices}\nEnd with 'Final choice: $LETTER'."},
        grader={"kind": "choice"},
    )
    gold = load_problems(spec)[0].gold
    assert gold["letters"] == "ABCDEF" and gold["format"] == "Final choice:"
    from relaxtune.graders import grade

    assert grade("choice", f"Final choice: {gold['answer']}", gold).correct
    spec.grader.answer_format = "Pick:"
    assert load_problems(spec)[0].gold["format"] == "Pick:"
    with pytest.raises(ValueError, match="at most 10 choices"):
        TaskSpec(
            **{
                **spec.model_dump(),
                "fields": {"question": "q", "answer": None, "choices": [f"c{i}" for i in range(11)]},
            }
        )


def test_thinking_tasks_keep_their_stops_for_the_answer():
    raw = yaml.safe_load(Path(load_task("gsm8k").source_file).read_text())
    spec = TaskSpec(**raw | {"stop": ["\n\nQuestion:"]})  # a thinking task: the stop waits for </think>
    assert spec.thinks and spec.stop == ["\n\nQuestion:"]
    plain = TaskSpec(
        **raw | {"stop": ["</think>"], "prompt": {"template": "{question}", "thinking": False}, "thinking_budget": None}
    )
    assert not plain.thinks  # without thinking, </think> is an ordinary stop string
    assert TaskSpec(**raw | {"prompt": {"template": "{question}", "thinking": False}}).thinks  # a budget thinks
