"""The options ``relaxtune tune`` and ``relaxtune export`` share, and how they become ``TuneSettings``
(a saved job, then a ``--config`` YAML, then flags on top)."""

from __future__ import annotations

import inspect
from typing import Optional

import typer

TUNE_FLAGS = dict(
    task=typer.Option(None, help="task name (see `relaxtune tasks`) or YAML path"),
    methods=typer.Option(None, help="comma-separated method ids \\[default: cactus,mentored]"),
    drafter=typer.Option(None, help="drafter: embedded name, folder, hub id, or prompt-lookup[:n] (no model) "
                                    "\\[default: embedded 0.5B]"),
    verifier=typer.Option(None, help="verifier \\[default: embedded 1.5B]"),
    dtype=typer.Option(None, help="bfloat16 (default), float16 or float32"),
    runtime=typer.Option(None, help="in-process backend: hf (transformers) or llamacpp (llama.cpp on the GGUF files; "
                         "pip install 'relaxtune\\[llamacpp]') \\[default: auto: llamacpp for the embedded pair when "
                         "installed, else hf]"),
    drafter_url=typer.Option(None, help="SGLang drafter server URL (with --verifier-url: tune against SGLang)"),
    verifier_url=typer.Option(None, help="SGLang verifier server URL"),
    tokenizer=typer.Option(None, help="tokenizer id/folder for SGLang \\[default: --verifier]"),
    native_url=typer.Option(None, help="STANDALONE speculative SGLang server for sglang_threshold "
                            "(`relaxtune serve --native-threshold`)"),
    concurrency=typer.Option(None, help="sequences in flight against SGLang \\[default: 8]"),
    batch_size=typer.Option(None, help="sequences the in-process engine decodes together \\[default: 8 on CPU, "
                            "32 on GPU]"),
    epsilon=typer.Option(None, help="allowed accuracy drop vs strict \\[default: 0.05]"),
    confidence=typer.Option(None, help="one-sided confidence of the drop bound \\[default: 0.9]"),
    c_rel=typer.Option(None, help="drafter/verifier cost ratio or 'measured' \\[default: measured]: a fixed "
                       "value overrides the measured profile"),
    remeasure_costs=typer.Option(None, "--remeasure-costs/--saved-costs", help="measure the cost profile anew, "
                                 "replacing the one saved in --output-dir \\[default: saved-costs]"),
    n_drafts=typer.Option(None, help="comma-separated draft lengths \\[default: 3,5,10,20]"),
    trials=typer.Option(None, help="trials per method \\[default: 8]"),
    limit=typer.Option(None, help="first N problems only"),
    seed=typer.Option(None, help="base seed \\[default: 0]"),
    stage_size=typer.Option(None, help="problems per pruning stage \\[default: 4]"),
    output_dir=typer.Option(None, help="records, Optuna db and tuned config \\[default: relaxtune-runs]"),
    storage=typer.Option(None, help="Optuna storage URL \\[default: sqlite:///<output-dir>/optuna.db]"),
    mlflow_uri=typer.Option(None, help="MLflow tracking URI \\[default: sqlite:///mlflow.db]"),
    max_length_ratio=typer.Option(None, help="optional guard on L_relax / L_strict"),
    max_truncated=typer.Option(None, help="optional guard on the truncated share"),
    export=typer.Option(None, help="tuned config path \\[default: <output-dir>/<task>.tuned.yaml]"),
    parallel_trials=typer.Option(None, help="trials this worker runs at once \\[default: 1]; start the same command "
                                 "on other hosts with the same --storage to add workers"),
    heartbeat=typer.Option(None, help="seconds between heartbeats of a running trial \\[default: 30]"),
    grace_period=typer.Option(None, help="seconds without a heartbeat before a trial is retried \\[default: 4 x "
                              "heartbeat]"),
    range_size=typer.Option(None, help="problems per evaluation range, shared among workers \\[default: all]"),
    job_id=typer.Option(None, help="the job's id in MLflow \\[default: a digest of storage, task and settings]"),
    confirm=typer.Option(None, help="confirm chosen points on a 'holdout' half of the problems the search never sees (default) or on fresh 'seeds' (a promise about these problems only) of the "
                         "problems the search never sees"),
    confirmations=typer.Option(None, help="points confirmed at most per method; the confidence is split evenly over "
                               "every confirmation the search allows \\[default: 2]"),
)
TUNE_TYPES = dict(concurrency=int, batch_size=int, trials=int, limit=int, seed=int, stage_size=int, epsilon=float,
                  confidence=float, max_length_ratio=float, max_truncated=float, remeasure_costs=bool,
                  parallel_trials=int, heartbeat=int, grace_period=int, range_size=int,
                  confirmations=int)  # the others are str


def settings_from(config: Optional[str], flags: dict, base: Optional[dict] = None):
    """TuneSettings from ``base`` (a saved job), then a YAML config file, then
    command-line flags on top.

    Raises:
        typer.BadParameter: an unreadable file or an invalid option, named.
    """
    import pydantic
    import yaml

    from ..tune.settings import TuneSettings

    merged: dict = dict(base or {})
    if config:
        try:
            loaded = yaml.safe_load(open(config)) or {}
        except (OSError, yaml.YAMLError) as err:
            raise typer.BadParameter(f"cannot read --config {config}: {err}") from None
        if not isinstance(loaded, dict):
            raise typer.BadParameter(f"--config {config} must hold a mapping of options, got {type(loaded).__name__}")
        merged |= {k.replace("-", "_"): v for k, v in loaded.items()}  # n-drafts and n_drafts both work
    for key, value in flags.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key in ("methods", "n_drafts") and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
            if key == "n_drafts":
                bad = [v for v in value if not v.lstrip("-").isdigit()]
                if bad:
                    raise typer.BadParameter(f"{flag}: {bad[0]!r} is not an integer (give e.g. 3,5,10)")
                value = [int(v) for v in value]
        if key == "c_rel" and value != "measured":
            try:
                value = float(value)
            except ValueError:
                raise typer.BadParameter(f"{flag}: {value!r} is neither a number nor 'measured'") from None
        merged[key] = value
    try:
        return TuneSettings(**merged)
    except pydantic.ValidationError as err:
        given = {k for k, v in flags.items() if v is not None}

        def where(loc) -> str:  # the flag, or the key of the --config file it came from
            key = str(loc[0]) if loc else ""
            return f"--{key.replace('_', '-')}" if key in given or not config else f"{config}: {key}"

        # a check across fields (a model validator) has no location: its message names what it is about
        lines = [f"{where(e['loc'])}: {_plain(e['msg'])}" if e["loc"] else _plain(e["msg"]) for e in err.errors()]
        raise typer.BadParameter("; ".join(lines)) from None
    except (ValueError, TypeError) as err:
        raise typer.BadParameter(str(err)) from None


def _plain(message: str) -> str:
    """A pydantic message without its library prefix (``Value error, unknown method 'foo'`` ->
    ``unknown method 'foo'``), starting lower-case as the other messages do."""
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message[:1].lower() + message[1:]


def tune_options(fn):
    """Give ``fn(config, **flags)`` a ``--config`` option and every option of
    ``TUNE_FLAGS`` (typer reads the signature), so ``tune`` and ``export`` share them."""
    kw = inspect.Parameter.KEYWORD_ONLY
    config = typer.Option(None, "--config", help="YAML with any of the options below")
    params = [inspect.Parameter("config", kw, default=config, annotation=Optional[str])]
    params += [inspect.Parameter(name, kw, default=option, annotation=Optional[TUNE_TYPES.get(name, str)])
               for name, option in TUNE_FLAGS.items()]
    fn.__signature__ = inspect.Signature(params)
    return fn
