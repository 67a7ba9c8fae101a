"""``relaxtune costs``: measure a serving profile (the forward costs at several serving
batch sizes) on the host that serves, for ``relaxtune export --cost-profile``."""

from __future__ import annotations

import typer

from .app import app, console, status
from .options import cli_type, group_of, setting_option
from .tables import JSON, Col, print_json, show


@app.command()
def costs(
    output: str = typer.Option(..., "--output", "-o", help="the JSON file to write (a serving profile)"),
    task: str = setting_option("task", default="humaneval"),
    n_drafts: cli_type("n_drafts") = setting_option("n_drafts"),
    serving_batch_sizes: cli_type("serving_batch_sizes") = setting_option(
        "serving_batch_sizes",
        help="comma-separated serving batch sizes to measure at, each once, or auto: 1,4,16 on a CPU or llama.cpp, "
        "1,8,32,128 on a GPU, the device's for SGLang servers",
    ),
    drafter: cli_type("drafter") = setting_option("drafter"),
    verifier: cli_type("verifier") = setting_option("verifier"),
    dtype: cli_type("dtype") = setting_option("dtype"),
    runtime: cli_type("runtime") = setting_option("runtime"),
    drafter_url: str | None = setting_option("drafter_url"),
    verifier_url: str | None = setting_option("verifier_url"),
    tokenizer: str | None = setting_option("tokenizer"),
    json_output: bool = JSON,
) -> None:
    """Measure the pair's forward costs at each serving batch size (AR step, drafter step,
    verification of N + 1 tokens; every shape timed interleaved, as a tuning job measures
    them) on this host or through its SGLang servers, and write them as JSON: the file
    `relaxtune export --cost-profile FILE` re-prices a finished job with."""
    import json
    from pathlib import Path

    from ..backends.costs import JOB_MAX_PASSES, JOB_MIN_PASSES
    from ..backends.load import load_backend
    from ..tasks.spec import build_prompt_ids, load_problems, load_task
    from ..tune.checks import check_draft_lengths
    from ..tune.serving_sizes import auto_batch_sizes, check_slots
    from ..tune.setting_groups import PairSettings, SearchSettings, StatsSettings
    from .checks import check_pair
    from .options import split_list

    pair = group_of(
        PairSettings,
        drafter=drafter,
        verifier=verifier,
        dtype=dtype,
        runtime=runtime,
        drafter_url=drafter_url,
        verifier_url=verifier_url,
        tokenizer=tokenizer,
    )
    drafts = group_of(SearchSettings, n_drafts=split_list("n_drafts", n_drafts)).n_drafts
    sizes = group_of(StatsSettings, serving_batch_sizes=serving_batch_sizes).serving_batch_sizes
    resolved = check_pair(pair)
    out = Path(output)
    if out.is_dir() or not out.parent.is_dir():
        raise typer.BadParameter(f"--output {output}: give a file in an existing folder")
    if not writable(out):  # before anything loads: the measurement would be lost
        raise typer.BadParameter(f"--output {output}: cannot write a file there")
    try:
        sizes = auto_batch_sizes(pair, resolved) if sizes == "auto" else sizes
        if resolved == "llamacpp":  # its contexts are made with max(sizes) slots, at most llama.cpp's limit
            from ..backends.llamacpp import MAX_SEQUENCES

            check_slots(pair.model_copy(update={"batch_size": min(max(sizes), MAX_SEQUENCES)}), sizes)
        spec = load_task(task)
        check_draft_lengths(drafts, spec.max_new_tokens)
        problem = load_problems(spec, 1)[0]
    except (ValueError, FileNotFoundError, KeyError) as err:
        raise typer.BadParameter(str(err)) from None
    with status(f"loading {pair.drafter} -> {pair.verifier}", json_output):
        loading = pair.backend | {"batch_size": max(sizes) if resolved == "llamacpp" else None}
        try:
            backend = load_backend(**loading)
        except (OSError, ValueError, RuntimeError) as err:
            raise typer.BadParameter(str(err)) from None
    sizes_shown = ", ".join(map(str, sizes))
    with status(f"measuring forward costs at serving batch sizes {sizes_shown} (interleaved passes)", json_output):
        profile = backend.cost_profile(
            build_prompt_ids(backend.tokenizer, spec, problem),
            drafts,
            batch_sizes=sizes,
            min_passes=JOB_MIN_PASSES,  # as a tuning job measures them
            max_passes=JOB_MAX_PASSES,
        )
    profile = with_costs_advice(profile)
    out.write_text(json.dumps(profile.to_dict(), indent=2))
    if json_output:
        print_json({"output": str(out), "profile": profile.to_dict()})
        return
    ks = sorted({k for p in profile.profiles.values() for k in p.t_verify})
    cols = [Col("batch", justify="right"), Col("t_AR ms", justify="right"), Col("t_draft ms", justify="right")]
    cols += [Col("c_rel", justify="right")] + [Col(f"verify({k}) ms", justify="right") for k in ks]
    rows = [
        [str(b), f"{p.t_ar * 1e3:.1f}", f"{p.t_draft * 1e3:.1f}", f"{p.c_rel:.3f}"]
        + [f"{p.t_verify[k] * 1e3:.1f}" if k in p.t_verify else "-" for k in ks]
        for b, p in profile.profiles.items()
    ]
    show("forward costs by serving batch size", cols, rows)
    for flag in profile.flags:
        console.print(f"warning: {flag}", markup=False, highlight=False)
    console.print(f"written to {out}: re-price a finished job with `relaxtune export --cost-profile {out}`")


COSTS_ADVICE = (
    "; other work was running: run `relaxtune costs` again with the host idle, or busy only with what it "
    "runs when it serves"
)


def with_costs_advice(profile):
    """``profile`` (a ``ServingProfile``) with each noisy flag's advice made this command's:
    the measurement's flags advise a tuning job's flags (``--remeasure-costs``, ``--c-rel``),
    which ``relaxtune costs`` lacks; the measurement part (``relaxtune.decoding.speed.noisy_flags``,
    up to its tolerance) is kept."""
    from dataclasses import replace

    from ..decoding.serving import ServingProfile
    from ..decoding.speed import SPREAD_TOLERANCE

    end = f"(tolerance {SPREAD_TOLERANCE:.0%})"

    def ours(flag: str) -> str:
        return flag.split(end, 1)[0] + end + COSTS_ADVICE if end in flag else flag

    profiles = {b: replace(p, flags=[ours(f) for f in p.flags]) for b, p in profile.profiles.items()}
    return ServingProfile(profiles, dict(profile.weights))


def writable(path) -> bool:
    """Whether a file can be written at ``path`` (its folder exists): tried with a
    temporary file beside it, removed at once; an existing file must be writable too."""
    import os
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".relaxtune-costs-"):
            pass
    except OSError:
        return False
    return not path.exists() or os.access(path, os.W_OK)
