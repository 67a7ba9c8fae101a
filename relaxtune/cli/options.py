"""Command-line options made from the settings' fields (``relaxtune.tune.settings``): one
default and one help text each, never written again here. ``tune`` and ``export`` take
every setting (``tune_options``); ``generate``, ``eval`` and ``plan`` take the ones they
share (``setting_option``). ``settings_from`` builds ``TuneSettings`` from a saved job,
then a ``--config`` YAML, then the flags on top."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, Literal

import typer

__all__ = [
    "setting_option",
    "option_help",
    "cli_type",
    "settings_from",
    "tune_options",
    "BOOL_FLAGS",
    "group_of",
    "finite",
    "split_list",
]

# a boolean setting's two flags (the second is the default's)
BOOL_FLAGS = {"remeasure_costs": ("--remeasure-costs", "--saved-costs")}


def _shown(name: str, value: Any) -> str:
    """How a default reads on the command line (lists comma-separated, booleans as their flag)."""
    if name in BOOL_FLAGS:
        return BOOL_FLAGS[name][0 if value else 1].lstrip("-")
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def option_help(name: str) -> str:
    """The help of setting ``name``: its description, then ``[default: <the model's default>]``
    when it has one (a default of None is told by the description)."""
    from ..tune.settings import field_info

    info = field_info(name)
    text = (info.description or "").replace("[", "\\[")
    if info.is_required() or info.default is None:
        return text
    return f"{text} \\[default: {_shown(name, info.default)}]"


def cli_type(name: str):
    """The type typer parses setting ``name`` with: the field's own (a closed choice stays
    one), ``str`` for a list (comma-separated) or a number-or-word (``c_rel``)."""
    from ..tune.settings import field_info

    annotation = field_info(name).annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = args[0] if len(args) == 1 else str
    if typing.get_origin(annotation) is Literal or annotation in (int, float, bool, str):
        return annotation
    return str  # list[...]: comma-separated


def setting_option(name: str, *, with_default: bool = True, **overrides):
    """The ``typer.Option`` of setting ``name``: the model's default (or None with
    ``with_default=False``, so a flag left out keeps a config's or a saved job's value) and help."""
    from ..tune.settings import field_info

    info = field_info(name)
    decls = BOOL_FLAGS.get(name, ())
    default = None if (not with_default or info.is_required()) else info.default
    if isinstance(default, list):
        default = _shown(name, default)
    default = overrides.pop("default", default)
    text = (info.description or "").replace("[", "\\[") if default is ... else option_help(name)  # required
    kwargs = dict(help=text, show_default=False) | overrides
    return typer.Option(default, *(["/".join(decls)] if decls else []), **kwargs)


def finite(ctx: typer.Context, param, value):
    """A typer callback: refuses NaN and infinity (click's float type reads both), naming the flag."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        raise typer.BadParameter(f"{value!r} is not a finite number", ctx=ctx, param=param)
    return value


def group_of(model, **values):
    """``model(**values)`` (a settings group, e.g. ``PairSettings``) from a command's options.

    Raises:
        typer.BadParameter: each refused value with its flag (exit code 2).
    """
    import pydantic

    try:
        return model(**values)
    except pydantic.ValidationError as err:
        lines = []
        for e in err.errors():
            name = next((str(p) for p in e["loc"] if p in values), None)
            flag = "" if name is None else "--" + name.replace("_", "-") + " "
            said = repr(e.get("input")) in e["msg"] or name is None
            lines.append(f"{flag}{'' if said else _value(e.get('input'))}: {_plain(e['msg'])}".replace(" :", ":"))
        raise typer.BadParameter("; ".join(lines)) from None


def split_list(key: str, value: str) -> list:
    """A comma-separated list flag's items (``--n-drafts``: integers, each refused by name).

    Raises:
        typer.BadParameter: an item of ``--n-drafts`` that is not an integer.
    """
    flag = "--" + key.replace("_", "-")
    items = [v.strip() for v in value.split(",") if v.strip()]
    if key != "n_drafts":
        return items
    bad = [v for v in items if not v.lstrip("-").isdigit()]
    if bad:
        raise typer.BadParameter(f"{flag}: {bad[0]!r} is not an integer (give e.g. 3,5,10)")
    return [int(v) for v in items]


def settings_from(config: str | None, flags: dict, base: dict | None = None):
    """TuneSettings from ``base`` (a saved job), then a YAML config file, then
    command-line flags on top.

    Raises:
        typer.BadParameter: an unreadable file or an invalid option, named.
    """
    import pydantic
    import yaml

    from ..tune.settings import GROUPS, TuneSettings, flat_fields

    merged: dict = dict(base or {})
    if config is not None and not config.strip():
        raise typer.BadParameter("--config is empty; give a YAML file of settings, or leave --config out")
    if config:
        try:
            loaded = yaml.safe_load(open(config)) or {}
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
            raise typer.BadParameter(f"cannot read --config {config}: {err}") from None
        if not isinstance(loaded, dict):
            raise typer.BadParameter(f"--config {config} must hold a mapping of options, got {type(loaded).__name__}")
        merged |= {str(k).replace("-", "_"): v for k, v in loaded.items()}  # n-drafts and n_drafts both work
    for key, value in flags.items():
        if value is None:
            continue
        if key in ("methods", "n_drafts", "deployable_on") and isinstance(value, str):
            value = split_list(key, value)
        if key == "c_rel" and value != "measured":
            try:
                value = float(value)
            except ValueError:
                raise typer.BadParameter(f"--c-rel: {value!r} is neither a number nor 'measured'") from None
        merged[key] = value
    try:
        return TuneSettings(**merged)
    except pydantic.ValidationError as err:
        given = {k for k, v in flags.items() if v is not None}

        def where(key: str) -> str:  # the flag, or the key of the --config file it came from
            return f"--{key.replace('_', '-')}" if key in given or not config else f"{config}: {key}"

        names = set(flat_fields())
        lines: dict[str, str] = {}  # one line per setting (a union's first refusal: c_rel's number)
        for e in err.errors():
            name = next((str(p) for p in e["loc"] if p in names), None)
            if name is None and e["loc"] and e["loc"][0] in GROUPS:  # a check across a group's fields
                lines.setdefault(str(e["loc"]), _plain(e["msg"]))
            elif name is None:  # an unknown key
                key = str(e["loc"][0]) if e["loc"] else ""
                lines.setdefault(key, f"{where(key)}: {_plain(e['msg'])}" if key else _plain(e["msg"]))
            else:
                said = e["type"] == "missing" or _named(e.get("input"), e["msg"])
                value = "" if said else f" {_value(e.get('input'))}"
                lines.setdefault(name, f"{where(name)}{value}: {_plain(e['msg'])}")
        raise typer.BadParameter("; ".join(lines.values())) from None
    except (ValueError, TypeError) as err:
        raise typer.BadParameter(str(err)) from None


def _named(value, message: str) -> bool:
    """Whether a check's ``message`` already names the refused ``value`` (or each of a list's items)."""
    items = value if isinstance(value, list) and value else [value]
    return repr(value) in message or all(repr(i) in message or str(i) in message for i in items)


def _value(value) -> str:
    """A refused value as the user typed it (a flag's text as is, a config's value as Python shows it)."""
    return value if isinstance(value, str) and value.strip() == value and value else repr(value)


def _plain(message: str) -> str:
    """A pydantic message without its library prefix (``Value error, unknown method 'foo'`` ->
    ``unknown method 'foo'``), starting lower-case as the other messages do."""
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message[:1].lower() + message[1:]


def tune_options(fn):
    """Give ``fn(config, **flags)`` a ``--config`` option and one option per setting
    (``relaxtune.tune.settings.flat_fields``; typer reads the signature), so ``tune`` and
    ``export`` share them."""
    from ..tune.settings import flat_fields

    kw = inspect.Parameter.KEYWORD_ONLY
    config = typer.Option(None, "--config", help="YAML with any of the options below")
    params = [inspect.Parameter("config", kw, default=config, annotation=str | None)]
    for name in flat_fields():
        kind = cli_type(name)
        number = kind in (int, float)  # parsed by the model, whose refusal names the value as typed
        option = setting_option(name, with_default=False, **({"metavar": f"<{kind.__name__}>"} if number else {}))
        params.append(inspect.Parameter(name, kw, default=option, annotation=(str if number else kind) | None))
    fn.__signature__ = inspect.Signature(params)
    return fn
