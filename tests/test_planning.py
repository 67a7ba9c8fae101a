"""The sample-size planner against by-hand calculations, and ``relaxtune plan``."""

import json
import math

import pytest
from typer.testing import CliRunner

from relaxtune.certify.planning import fewest_problems, plan, problems_needed
from relaxtune.certify.stats import smallest_certifiable_drop
from relaxtune.cli import app

from .tiny_task import write_tiny_task


def test_problems_needed_by_hand():
    # (z_0.9 + z_0.8)^2 * (0.1 - 0) / 0.05^2 = (1.28155 + 0.84162)^2 * 40 = 180.3 -> 181
    assert problems_needed(0.05, 0.9, 0.1) == 181
    # (z_0.95 + z_0.5)^2 * (0.2 - 0.02^2) / (0.1 - 0.02)^2 = 1.64485^2 * 0.1996 / 0.0064 = 84.4 -> 85
    assert problems_needed(0.1, 0.95, 0.2, true_drop=0.02, power=0.5) == 85
    # repeats divide the per-problem variance when the loss is spread: 180.3 / 48 -> 4, but 53 problems x 48
    # are the fewest whose perfect sample certifies 0.05 with the cluster bound
    assert problems_needed(0.05, 0.9, 0.1, repeats=48) == fewest_problems(0.05, 0.9, 48) == 53
    assert smallest_certifiable_drop(53, 48, 0.9) <= 0.05 < smallest_certifiable_drop(52, 48, 0.9)
    assert problems_needed(0.05, 0.9, 0.1, repeats=48, concentrated=True) == 181  # repeats add nothing
    # a point with almost no discordance needs only what a perfect sample needs: ln 0.1 / ln 0.95 = 44.9 -> 45
    assert problems_needed(0.05, 0.9, 0.001) == fewest_problems(0.05, 0.9) == 45
    assert problems_needed(0.05, 0.9, 0.1, true_drop=0.05) is None  # at epsilon: must not be certified
    with pytest.raises(ValueError, match="discordance"):
        problems_needed(0.05, 0.9, 0.01, true_drop=0.02)


def test_plan_line_states_the_smallest_certifiable_drop_and_the_need():
    p = plan(8, 1, 0.05, 0.9)
    assert p.smallest_certifiable == pytest.approx(1 - 0.1 ** (1 / 8), abs=1e-6)  # 0.250
    assert p.needed == p.needed_concentrated == 181
    assert p.line() == ("with 8 problems x 1 the smallest certifiable drop is 0.250 (90% one-sided); about 181 "
                        "problems x 1 would certify 0.05 for a point with true drop 0 and discordance 0.10 "
                        "(80% of the time)")
    clustered = plan(30, 48, 0.05, 0.9)
    assert "53 problems x 48 would certify 0.05 if the loss spreads evenly over problems (181 if it concentrates" \
        in clustered.line()
    # at 95 % the closed form ln 0.05 / ln 0.8 = 13.4 asks for 14, but there a perfect sample's exact bound is 0.219
    assert math.ceil(math.log(0.05) / math.log(0.8)) == 14 and smallest_certifiable_drop(14, 1, 0.95) > 0.2
    assert fewest_problems(0.2, 0.95) == 15 and smallest_certifiable_drop(15, 1, 0.95) <= 0.2


def test_plan_command_for_humaneval_without_models(tmp_path):
    out = CliRunner().invoke(app, ["plan", "--task", "humaneval", "--epsilon", "0.05", "--output-dir",
                                   str(tmp_path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "sample: 164 problems x 1, from the task's problems" in text
    assert "smallest certifiable drop is 0.014" in text and "about 181 problems x 1 would certify 0.05" in text
    narrow = CliRunner().invoke(app, ["plan", "--task", "humaneval", "--epsilon", "0.05", "--output-dir",
                                      str(tmp_path)], env={"COLUMNS": "100"}).output.splitlines()
    assert all(len(line) <= 100 for line in narrow if not line.startswith("sample: "))  # a path is never cut
    full = json.loads(CliRunner().invoke(app, ["plan", "--task", "humaneval", "--epsilon", "0.05", "--discordance",
                                               "0.15", "--output-dir", str(tmp_path), "--json"]).output)
    assert full["plan"]["problems"] == 164 and full["plan"]["needed"] == problems_needed(0.05, 0.9, 0.15, 0.0, 0.8, 1)
    assert [r["discordance"] for r in full["needed"]] == [0.02, 0.05, 0.1, 0.15, 0.2, 0.4]
    assert all(r["problems"] == r["problems_concentrated"] == problems_needed(0.05, 0.9, r["discordance"], 0.0, 0.8, 1)
               for r in full["needed"])  # one repeat: the loss cannot concentrate


def test_plan_command_reads_strict_records(tmp_path):
    task = write_tiny_task(tmp_path)
    folder = tmp_path / "runs" / "tiny_math-v1" / "pair"
    folder.mkdir(parents=True)
    rows = [{"problem_id": str(i), "repeat": 0, "failed": i == 5, "correct": True} for i in range(6)]
    (folder / "strict__N4__seed0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut')
    out = CliRunner().invoke(app, ["plan", "--task", task, "--epsilon", "0.2", "--output-dir", str(tmp_path / "runs")],
                             env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "sample: 5 problems x 1, from strict's records" in text  # the failed sample and the cut line left out
    assert f"smallest certifiable drop is {smallest_certifiable_drop(5, 1, 0.9):.3f}" in text
    bad = CliRunner().invoke(app, ["plan", "--task", task, "--epsilon", "0.05", "--discordance", "0.01", "--drop",
                                   "0.02"], env={"COLUMNS": "250"})
    assert bad.exit_code != 0 and "discordance must lie in" in " ".join(bad.output.split())
