"""The golden run of issue 33: one tiny job, fixed seeds, written so two code bases can be compared byte for byte.

Usage: ``PYTHONPATH=<checkout> python scripts/golden_run.py <out folder>`` (run from the checkout). It writes

- ``engine.jsonl``: every method of the registry (and AR) on a tiny float32 pair (``tests/tiny_models.tiny_pair``,
  an EOS id and stop strings so responses end inside rounds) and on prompt lookup over its verifier, one response at
  a time (``generate``) and batched (``generate_batch``, 1 and 5 rows, continuous refill): ids, text and every
  counter of the statistics (seconds left out);
- ``job-b<batch>/records/...jsonl``: the records of ``relaxtune tune`` on a saved tiny float32 pair and the tiny math
  task (strict + cactus + ens, 2 trials, N = 2, 4 problems, c_rel 0.3) run batched (``--batch-size 4``) and one at a
  time (``--batch-size 1``), each record with its timing fields removed;
- ``job-b<batch>/optuna.json``: every study's trials (number, state, params, values, user attributes, timing removed);
- ``job-b<batch>/tuned.yaml``: the tuned config with timestamps, run ids and paths removed.

Everything is float32 (bitwise reproducible on one machine). With ``--bfloat16-engine`` only ``engine.jsonl`` is
written, on a bfloat16 copy of the pair: there batched responses may differ from one-at-a-time ones by the rounding
of different batch shapes (``relaxtune.engine.batch``), but two code bases that run the same forwards agree.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))

# fields that measure time or name a place or a run: not part of the comparison
DROP = (
    "seconds",
    "second",
    "time",
    "date",
    "created",
    "run_id",
    "path",
    "uri",
    "duration",
    "started",
    "finished",
    "heartbeat",
    "host",
    "pid",
    "worker",
    "mlflow",
    "measured",
    "machine",
    "cost_profile",
)
# the source digests of the grader and of relaxtune.engine and the decoding core
# (relaxtune.tune.identity.decoding_identity): it changes
# with any edit of that code by design (records of other code are regenerated), so it is no output of the run
CODE_DIGESTS = ("decoder", "decoding", "grader")  # "grader": the grading code's digest (the same policy)
# what schema v3 (relaxtune.tune.records) adds to what the base commit wrote (v2): the records' and metrics' schema,
# a point's named knobs, its relaxation scope and serving batch size, and the tuned config's version, batch sizes
# and best point per batch size; the comparison is of everything else
SCHEMA_V3 = (
    "schema",
    "schema_version",
    "knobs",
    "scope",
    "batch_size",
    "serving_batch_sizes",
    "by_batch_size",
    "deploy",
    "decoding",
    "runtime",
    "weights",
    "fastest_speculative",
)  # deploy..weights: each point's deployment (relaxtune.report.deploy); fastest_speculative: the point a plain
# recommendation (issue 34: serve the verifier alone when nothing pays) keeps beside it, null when a point pays
WORK = Path("/tmp/relaxtune-golden-work")  # a fixed folder: study names hold the models' paths


# what a fix changed on purpose since the base commit, by the section that holds it: the sample plan assumes the
# trials' pooled discordance at its upper bound (relaxtune.certify.planning.planning_discordance; it took the
# observed value, 1e-6 when every pair agreed), so its discordance, the problems needed and their line differ
CHANGED = {"sample": ("discordance", "needed", "power_needed", "line")}


def _keep(key: str, section: str | None = None) -> bool:
    if key in CHANGED.get(section, ()):
        return False
    return not any(d in str(key).lower() for d in DROP) and key not in CODE_DIGESTS and key not in SCHEMA_V3


def _clean(value, section: str | None = None):
    if isinstance(value, dict):
        return {k: _clean(v, k) for k, v in sorted(value.items()) if _keep(k, section)}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.12g}")
    return value


def _dump(obj) -> str:
    return json.dumps(_clean(obj), sort_keys=True, default=str)


def reclean(name: str, text: str) -> str:
    """An output file's text written by another code base (``name`` tells its format) cleaned again as this one
    cleans (``_clean``): what a comparison drops is dropped from both sides."""
    import yaml

    if name.endswith(".jsonl"):
        return "\n".join(_dump(json.loads(line)) for line in text.splitlines() if line.strip()) + "\n"
    if name.endswith(".json"):
        return json.dumps(_clean(json.loads(text)), sort_keys=True, indent=1, default=str) + "\n"
    return yaml.safe_dump(_clean(yaml.safe_load(text)), sort_keys=True)


def _view(gen) -> dict:
    return {"ids": list(gen.token_ids), "text": gen.text, "stats": gen.stats.to_dict()}


def engine_run(out: Path, dtype: str = "float32") -> None:
    from relaxtune.backends.hf import HFBackend
    from relaxtune.backends.lookup import PromptLookupBackend
    from relaxtune.decoding.methods import METHODS
    from relaxtune.decoding.sampling import SamplingParams
    from relaxtune.engine.batch import Request, generate_batch
    from relaxtune.engine.sequence import generate
    from tests.tiny_models import tiny_pair

    pair = tiny_pair(noise=0.2)
    if dtype != "float32":  # copies: tiny_pair is cached for the tests
        import copy

        pair = HFBackend(
            copy.deepcopy(pair.drafter).to(getattr(torch, dtype)),
            copy.deepcopy(pair.verifier).to(getattr(torch, dtype)),
            name="tiny",
        )
    model = HFBackend(pair.drafter, pair.verifier, name="tiny-eos")
    model.eos_token_ids = frozenset({37})
    lookup = PromptLookupBackend(HFBackend(None, pair.verifier, name="tiny-eos-v"), max_ngram=3)
    lookup.eos_token_ids = frozenset({37})
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    requests = []
    for i, n in enumerate([1, 9, 3, 14, 2, 6, 11]):
        prompt = [(7 * i + 3 * j) % 64 for j in range(n)] * (2 if i % 2 else 1)
        stop = (" 11", " 5") if i % 3 == 0 else ()
        requests.append(Request(prompt, seed=100 + i, max_new_tokens=10 + 2 * i, stop=stop, key=i))
    lines = []
    for bname, backend in (("model", model), ("lookup", lookup)):
        for method, spec in [("ar", None), *METHODS.items()]:
            knob = None if spec is None or not spec.has_knob else spec.grid[len(spec.grid) // 2]
            kw = dict(method=method, knob=knob, n_draft=3, sampling=sampling)
            for r in requests:
                g = generate(backend, r.prompt_ids, max_new_tokens=r.max_new_tokens, seed=r.seed, stop=r.stop, **kw)
                lines.append(_dump({"backend": bname, "method": method, "mode": "sequence", "key": r.key, **_view(g)}))
            for size in (1, 5):
                got = {r.key: g for r, g in generate_batch(backend, requests, batch_size=size, **kw)}
                for key in sorted(got):
                    g = got[key]
                    body = {"error": repr(g)} if isinstance(g, Exception) else _view(g)
                    lines.append(
                        _dump({"backend": bname, "method": method, "mode": f"batch{size}", "key": key, **body})
                    )
    (out / "engine.jsonl").write_text("\n".join(lines) + "\n")


def _write(path: Path, text: str, work: Path) -> None:
    """``text`` with the work folder's name replaced by ``WORK``, as a path and as study names spell it."""
    path.write_text(text.replace(str(work), "WORK").replace(re.sub(r"[^A-Za-z0-9_-]", "_", str(work)), "WORK"))


def job_run(out: Path, work: Path, batches: tuple[int, ...] = (4, 1)) -> None:
    import optuna
    import yaml
    from typer.testing import CliRunner

    from relaxtune.cli import app
    from tests.tiny_models import save_tiny_model
    from tests.tiny_task import write_tiny_task

    models = work / "models"
    drafter = save_tiny_model(models / "drafter", noise=0.2)
    verifier = save_tiny_model(models / "verifier")
    task = write_tiny_task(work)
    for batch in batches:
        runs = work / f"runs-b{batch}"
        args = [
            "tune",
            "--task",
            task,
            "--drafter",
            drafter,
            "--verifier",
            verifier,
            "--output-dir",
            str(runs),
            "--mlflow-uri",
            f"sqlite:///{work / f'mlflow-b{batch}.db'}",
            "--methods",
            "cactus,ens",
            "--trials",
            "2",
            "--n-drafts",
            "2",
            "--limit",
            "4",
            "--dtype",
            "float32",
            "--c-rel",
            "0.3",
            "--stage-size",
            "2",
            "--confirm",
            "seeds",
            "--runtime",
            "hf",
            "--batch-size",
            str(batch),
        ]
        res = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
        if res.exit_code != 0:
            raise SystemExit(f"tune failed ({batch}):\n{res.output}\n{res.exception!r}")
        dest = out / f"job-b{batch}"
        (dest / "records").mkdir(parents=True)
        for path in sorted(runs.rglob("*.jsonl")):
            rel = path.relative_to(runs)
            name = "__".join(rel.parts[:1] + rel.parts[-1:])  # the pair's folder holds absolute paths
            lines = [_dump(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
            _write(dest / "records" / name, "\n".join(lines) + "\n", work)
        storage = f"sqlite:///{runs / 'optuna.db'}"
        studies = {}
        for summary in sorted(optuna.get_all_study_summaries(storage), key=lambda s: s.study_name):
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            studies[summary.study_name] = [
                {
                    "number": t.number,
                    "state": t.state.name,
                    "params": t.params,
                    "values": t.values,
                    "user_attrs": t.user_attrs,
                }
                for t in study.get_trials(deepcopy=False)
            ]
            studies[summary.study_name + ":study_attrs"] = study.user_attrs
        _write(dest / "optuna.json", json.dumps(_clean(studies), sort_keys=True, indent=1, default=str) + "\n", work)
        tuned = yaml.safe_load((runs / "tiny_math.tuned.yaml").read_text())
        _write(dest / "tuned.yaml", yaml.safe_dump(_clean(tuned), sort_keys=True), work)


def main() -> None:
    import shutil

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=False)
    torch.set_num_threads(1)
    if sys.argv[2:] == ["--bfloat16-engine"]:  # the engine part alone on a bfloat16 copy of the pair
        engine_run(out, "bfloat16")
        return
    engine_run(out)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    try:
        job_run(out, WORK)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
