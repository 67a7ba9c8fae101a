"""Which model an SGLang server serves, checked against the model a job names.

A job names its pair (``--drafter`` / ``--verifier``: an embedded name, a hub id or a
folder) and its records and studies carry those names; a server started on another
model would fill them with another pair's samples. SGLang 0.5.23 answers
``GET /model_info`` (``/get_model_info`` is its deprecated alias) with the
``model_path`` it loaded and its ``served_model_name``
(``srt/entrypoints/http_server.py``).
"""

from __future__ import annotations

import os

from .http import ServerClient, SGLangError

__all__ = ["model_info", "name_forms", "serves", "check_serves"]


def model_info(server: ServerClient) -> dict:
    """``GET /model_info`` of ``server`` (``/get_model_info`` where that is missing).

    Raises:
        SGLangError: neither answers JSON with a ``model_path``.
    """
    try:
        info = server.get_json("/model_info")
    except SGLangError:
        info = server.get_json("/get_model_info")
    if not isinstance(info, dict) or not isinstance(info.get("model_path"), str):
        raise SGLangError(f"{server}: /model_info has no model_path")
    return info


def _norm(name: str) -> str:
    name = name.rstrip("/") or name
    return os.path.realpath(os.path.expanduser(name)) if os.path.exists(os.path.expanduser(name)) else name


def name_forms(named: str) -> set[str]:
    """What a server may report for the model named ``named``: the name itself, the
    folder it resolves to, and for an embedded name its converted folder and upstream
    hub id (``relaxtune.backends.embedded``); compared by ``serves``."""
    from .embedded import EMBEDDED, cache_dir

    forms = {_norm(named)}
    if named in EMBEDDED:
        forms |= {_norm(str(cache_dir() / named / "hf")), EMBEDDED[named].hf_id}
    return forms


def serves(named: str, info: dict) -> bool:
    """Whether a server whose ``/model_info`` is ``info`` serves the model named ``named``:
    one of ``name_forms(named)`` equals its ``model_path`` or ``served_model_name``
    (folders compared by real path), or their last path parts are equal (a hub id
    ``org/Model`` and a local copy ``/models/Model``, case-insensitive)."""
    reported = {_norm(v) for v in (info.get("model_path"), info.get("served_model_name")) if isinstance(v, str) and v}
    forms = name_forms(named)
    if forms & reported:
        return True
    return bool({_tail(f) for f in forms} & {_tail(r) for r in reported})


def _tail(path: str) -> str:
    """The last part of a path or hub id, lower-case; of an embedded model's converted
    folder ``<cache>/<name>/hf``, its ``<name>``."""
    parts = path.rstrip("/").split("/")
    return (parts[-2] if parts[-1] == "hf" and len(parts) > 1 else parts[-1]).lower()


def check_serves(server: ServerClient, named: str, flag: str) -> dict:
    """``model_info(server)``, refused unless it ``serves(named, ...)``.

    Raises:
        SGLangError: naming the model the server serves and the one ``flag`` names.
    """
    info = model_info(server)
    if not serves(named, info):
        served = info.get("served_model_name") or info["model_path"]
        raise SGLangError(
            f"{server} serves {served!r} (model_path {info['model_path']!r}), not {named!r} as "
            f"{flag} names it: point {flag}'s URL at a server of that model, or name the model it serves"
        )
    return info
