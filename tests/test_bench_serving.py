"""The serving benchmark (``relaxtune.bench.serving``) on the simulated pair of
``relaxtune.bench.serving_sim``: its costs are the roofline's exactly, its clock virtual,
so the modeled side, the measured side and the crossover are checked without timing."""

import json

import pytest

from relaxtune.bench import serving
from relaxtune.bench.serving_sim import Roofline, SimServingPair
from relaxtune.decoding.serving import stops_paying_at


def test_the_roofline_prices_a_forward_by_its_tokens():
    r = Roofline(1e-3, 8)
    assert r.seconds(1, 1) == 1e-3 and r.seconds(2, 4) == 1e-3 and r.seconds(4, 3) == pytest.approx(1.5e-3)


def test_the_simulated_pair_profile_is_its_roofline_at_each_batch_size():
    pair = SimServingPair.crossing_at(8)
    profile = pair.cost_profile([1, 2, 3], [2], batch_sizes=[1, 4, 8, 16])
    assert profile.batch_sizes == [1, 4, 8, 16]
    at = {b: (p.t_ar, p.t_draft, p.t_verify[3]) for b, p in profile.profiles.items()}
    assert at[1] == pytest.approx((1e-3, 1e-4, 1e-3))
    assert at[4] == pytest.approx((1e-3, 1e-4, 1.5e-3))
    assert at[8] == pytest.approx((1e-3, 1e-4, 3e-3))  # AR at its knee: N + 1 tokens cost N + 1 steps
    assert at[16] == pytest.approx((2e-3, 1e-4, 6e-3))
    # no acceptance pays from batch 8 on (l_accept = N at best); strict's acceptance pays below
    assert profile.at(8).speedup(2.0, 2) < 1 and profile.at(16).speedup(2.0, 2) < 1
    assert profile.at(4).speedup(1.0, 2) > 1


def test_the_simulated_crossover_is_named_where_it_was_built(tmp_path, capsys):
    path = tmp_path / "serving.json"
    argv = ["--runtime", "simulated", "--batch-sizes", "1,2,4,8,16", "--n-draft", "2", "--prompts", "16"]
    argv += ["--max-new-tokens", "24", "--crossing", "8", "--json", str(path)]
    assert serving.main(argv) == 0
    result = json.loads(path.read_text())
    assert result["benchmark"] == "serving" and result["command"].startswith("python -m relaxtune.bench.serving")
    (table,) = result["tables"]
    assert table["columns"][:8] == [
        "B",
        "t_AR ms",
        "t_draft ms",
        "t_verify(3) ms",
        "strict l_accept",
        "strict modeled",
        "strict measured",
        "strict gap",
    ]
    assert table["columns"][8:] == ["cactus 1 l_accept", "cactus 1 modeled", "cactus 1 measured", "cactus 1 gap"]
    rows = {r[0]: r for r in table["rows"]}
    assert sorted(rows) == [1, 2, 4, 8, 16]
    assert [rows[b][1:4] for b in (1, 8, 16)] == [[1.0, 0.1, 1.0], [1.0, 0.1, 3.0], [2.0, 0.1, 6.0]]
    for r in rows.values():
        assert 0 < r[4] < r[8] <= 2  # cactus accepts more than strict
    best = {b: max(r[5], r[9]) for b, r in rows.items()}
    measured = {b: max(r[6], r[10]) for b, r in rows.items()}
    assert stops_paying_at(best) == 8 and stops_paying_at(measured) == 8
    assert table["notes"][0].startswith("speculation stops paying at B = 8, measured: 8")
    out = capsys.readouterr().out
    assert "| 8 | 1.0 | 0.1 | 3.0 |" in out


def test_a_backend_without_serving_batch_sizes_is_named():
    class Old:
        def cost_profile(self, prompt_ids, n_drafts, min_passes=5, max_passes=15):
            raise AssertionError("not reached")

    with pytest.raises(RuntimeError, match="Old.cost_profile does not measure serving batch sizes"):
        serving._profile(Old(), [1], 2, [1, 4])
