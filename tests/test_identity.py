"""Stored verdicts know the code that made them (``relaxtune.tune.identity``): an upgraded grader,
math-verify or decoding core is never served an old verdict; records are re-graded or regenerated."""

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from relaxtune.graders import Verdict
from relaxtune.tune import evaluation, identity, point_records
from relaxtune.tune.evaluation import evaluate
from relaxtune.tune.identity import source_digest
from relaxtune.tune.point_records import DecodeConfig

from .test_evaluation import tiny_task


@pytest.fixture
def fresh_identity(monkeypatch):
    """Identities computed anew (they are cached per process); the caches restored after."""
    identity.grader_identity.cache_clear()
    identity.decoding_identity.cache_clear()
    yield
    monkeypatch.undo()
    identity.grader_identity.cache_clear()
    identity.decoding_identity.cache_clear()


def test_the_source_digest_follows_behaviour_not_docstrings(tmp_path, monkeypatch):
    pkg = tmp_path / "fakegrader"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A grader."""\n')
    (pkg / "rule.py").write_text('def grade(x):\n    """Right when positive."""\n    return x > 0\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    before = source_digest(("fakegrader",))
    (pkg / "rule.py").write_text(
        'def grade(x):\n    """Right when positive, now said otherwise."""\n\n    return x > 0  # a comment\n'
    )
    assert source_digest(("fakegrader",)) == before  # docs, comments, layout: the same code
    (pkg / "rule.py").write_text('def grade(x):\n    """Right when positive."""\n    return x >= 0\n')
    assert source_digest(("fakegrader",)) != before  # other behaviour


def test_workers_in_threads_never_parse_at_once(fresh_identity, monkeypatch):
    """CPython 3.11's ast.parse is not thread-safe (python/cpython#106905): three tuner
    threads asking for the identity at once failed a trial with "AST constructor
    recursion depth mismatch". Every parse is serialized."""
    parse, inside, most = identity.ast.parse, [0], [0]

    def slow_parse(*args, **kwargs):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.002)  # a window in which an unserialized second parse would enter
        try:
            return parse(*args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(identity.ast, "parse", slow_parse)
    got: list = []
    threads = [
        threading.Thread(target=lambda: got.append((identity.grader_identity(), identity.decoding_identity())))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and len(got) == 4 and len(set(got)) == 1


def test_the_graders_identity_covers_every_grader_module_and_math_verify(fresh_identity, monkeypatch):
    from importlib import util

    files = {p.name for p in identity._files("relaxtune.graders")}
    assert {"math.py", "code.py", "choice.py", "child.py"} <= files  # the sandbox's included
    assert identity._files("relaxtune.engine") and util.find_spec("relaxtune.decoding.rules")
    now = identity.grader_identity()
    real = identity._version
    monkeypatch.setattr(identity, "_version", lambda p: "0.9.1" if p == "math-verify" else real(p))
    identity.grader_identity.cache_clear()
    assert identity.grader_identity() != now


def _verdicts(path: Path) -> dict:
    """The last record of each sample in a records file, and how many lines it has."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {(r["problem_id"], r["repeat"]): r for r in lines}, len(lines)


def test_an_old_verdict_is_regraded_after_the_grader_changes(
    tiny_backend, tmp_path, monkeypatch, fresh_identity, caplog
):
    spec, config = tiny_task(repeats=2), DecodeConfig("strict", None, 2, seed=3)
    first = evaluate(spec, tiny_backend, config, output_dir=tmp_path, limit=2, progress=False)
    records, lines = _verdicts(first.path)
    assert lines == 4 and all(r["grader"] == identity.grader_identity() for r in records.values())
    assert all(r["decoder"] == identity.decoding_identity() for r in records.values())

    # a grader that judges otherwise, and math-verify reporting another version
    generated = []
    real_responses = evaluation._responses
    monkeypatch.setattr(evaluation, "_responses", lambda *a: generated.extend(a[3]) or real_responses(*a))
    monkeypatch.setattr(evaluation, "grade", lambda kind, text, gold, **o: Verdict(True, "correct", "changed", "new"))
    same = evaluate(spec, tiny_backend, config, output_dir=tmp_path, limit=2, progress=False)
    assert [r["extracted"] for r in same.records] == [r["extracted"] for r in first.records]  # same code: reused
    real = identity._version
    monkeypatch.setattr(identity, "_version", lambda p: "0.9.1" if p == "math-verify" else real(p))
    identity.grader_identity.cache_clear()
    with caplog.at_level(logging.WARNING, logger="relaxtune.tune.evaluation"):
        again = evaluate(spec, tiny_backend, config, output_dir=tmp_path, limit=2, progress=False)
    assert generated == []  # re-graded from the recorded outputs, nothing generated
    assert [r["extracted"] for r in again.records] == ["changed"] * 4 and again.accuracy == 1.0
    assert "4 record(s) were graded by other grader code" in caplog.text
    records2, lines2 = _verdicts(first.path)
    assert lines2 == 8 and all(r["grader"] == identity.grader_identity() for r in records2.values())
    assert [r["output"] for r in records2.values()] == [r["output"] for r in records.values()]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="relaxtune.tune.evaluation"):
        evaluate(spec, tiny_backend, config, output_dir=tmp_path, limit=2, progress=False)
    assert caplog.text == "" and _verdicts(first.path)[1] == 8  # once re-graded, served as they are


def test_a_sample_of_another_decoding_core_is_generated_again(
    tiny_backend, tmp_path, monkeypatch, fresh_identity, caplog
):
    spec, config = tiny_task(), DecodeConfig("cactus", 1.0, 2, seed=1)
    first = evaluate(spec, tiny_backend, config, output_dir=tmp_path, limit=3, progress=False)
    monkeypatch.setattr(point_records, "decoding_identity", lambda: "another-core")
    with caplog.at_level(logging.WARNING, logger="relaxtune.tune.evaluation"):
        again = evaluate(spec, tiny_backend, config, output_dir=tmp_path, limit=3, progress=False)
    assert "3 record(s) were generated by other decoding code" in caplog.text
    records, lines = _verdicts(first.path)
    assert lines == 6 and {r["decoder"] for r in records.values()} == {"another-core"} and again.n == 3
    assert point_records.finished_samples(tmp_path, spec, config, tiny_backend.name, again_problems(spec)) == 3


def again_problems(spec):
    from relaxtune.tasks.spec import load_problems

    return load_problems(spec, 3)


def test_the_prefect_cache_key_changes_with_the_code_identity(tmp_path, monkeypatch, fresh_identity):
    from relaxtune.flows.steps import evaluation_cache_key

    from .tiny_task import write_tiny_task

    params = {
        "settings": {"task": write_tiny_task(tmp_path), "drafter": "d", "verifier": "v"},
        "method": "cactus",
        "knob": 0.1,
        "n_draft": 2,
        "seed": 0,
        "problem_ids": ("0", "1"),
    }
    key = evaluation_cache_key(None, params)
    real = identity._version
    monkeypatch.setattr(identity, "_version", lambda p: "0.9.1" if p == "math-verify" else real(p))
    identity.grader_identity.cache_clear()
    assert evaluation_cache_key(None, params) != key
    monkeypatch.setattr(identity, "_version", real)
    identity.grader_identity.cache_clear()
    assert evaluation_cache_key(None, params) == key
    monkeypatch.setattr(identity, "decoding_identity", lambda: "another-core")
    assert evaluation_cache_key(None, params) != key
