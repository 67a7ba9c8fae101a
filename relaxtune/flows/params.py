"""Flow parameters made from the settings' fields (``relaxtune.tune.settings``): a parameter
named after a setting and given ``SETTING`` (or ``FROM_SETTINGS``: None, the flow's
``settings`` value) as its default takes the field's default, type
and description (Prefect reads them from the signature and the docstring's ``Args:``), so a
flow never writes a setting's default or help again."""

from __future__ import annotations

import copy
import inspect

__all__ = ["SETTING", "FROM_SETTINGS", "from_settings"]


class _Setting:
    def __repr__(self) -> str:
        return "SETTING"


SETTING = _Setting()  # "this parameter is the setting of the same name"
FROM_SETTINGS = _Setting()  # the same, defaulting to None: the flow's ``settings`` dict's value, else the default


def from_settings(fn):
    """Give ``fn``'s ``SETTING`` parameters the settings' defaults and types, and document
    each in an ``Args:`` section appended to its docstring (with any other parameter
    documented there by ``fn`` itself kept).

    Raises:
        KeyError: a ``SETTING`` parameter that names no setting.
    """
    from relaxtune.tune.settings import field_info

    params, lines = [], []
    for p in inspect.signature(fn).parameters.values():
        if p.default is SETTING or p.default is FROM_SETTINGS:
            info = field_info(p.name)
            text = info.description
            if info.is_required():
                default, annotation = inspect.Parameter.empty, info.annotation
            elif p.default is FROM_SETTINGS:
                default, annotation = None, info.annotation | None
                text += f" (default: the settings' {p.name}, else {info.default})"
            else:
                default = copy.deepcopy(info.default)
                annotation = info.annotation if default is not None else info.annotation | None
            p = p.replace(default=default, annotation=annotation)
            lines.append(f"    {p.name}: {text}")
        params.append(p)
    defaults = tuple(p.default for p in params if p.default is not inspect.Parameter.empty)
    fn.__defaults__ = defaults or None
    fn.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty} | (
        {"return": fn.__annotations__["return"]} if "return" in fn.__annotations__ else {}
    )
    if lines:
        doc = inspect.cleandoc(fn.__doc__ or "")
        head, sep, rest = doc.partition("\nArgs:\n")
        fn.__doc__ = head.rstrip() + "\n\nArgs:\n" + "\n".join(lines) + ("\n" + rest.rstrip() if sep else "") + "\n"
    return fn
