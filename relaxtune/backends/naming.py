"""The name of a model pair in records and study names, known without loading anything.

One function per form, every backend's name built here:

- in-process transformers (``hf``): ``<drafter>-><verifier>``, embedded names and hub
  ids as given, local folders by absolute path, ``@<dtype>`` unless bfloat16;
- llama.cpp (``llamacpp``): ``<drafter>-><verifier>@llamacpp``, embedded names and
  ``prompt-lookup`` as given, files by resolved absolute path (records and studies of
  the two runtimes never mix);
- SGLang servers: ``sglang-<drafter>-><verifier>`` as the job names the models;
- prompt lookup wrapped around a loaded verifier backend: ``prompt-lookup-><its name>``
  (``parse_lookup`` reads the drafter name ``prompt-lookup[:<largest n-gram>]``).

Changing a form here renames every record folder and study of that form: earlier runs
would no longer resume.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pair_name", "gguf_pair_name", "server_pair_name", "lookup_name", "parse_lookup", "LLAMACPP", "NAME"]

LLAMACPP = "llamacpp"
NAME = "prompt-lookup"  # the drafter's name on the command line (``--drafter prompt-lookup[:<max n>]``)
MAX_NGRAM = 3  # prompt lookup's default largest n-gram


def parse_lookup(drafter: str | None) -> int | None:
    """The largest n-gram of a prompt-lookup drafter name (``prompt-lookup`` -> 3,
    ``prompt-lookup:4`` -> 4); None for any other drafter.

    Raises:
        ValueError: ``prompt-lookup:<x>`` with x not an integer >= 1.
    """
    if drafter is None or not (drafter == NAME or drafter.startswith(NAME + ":")):
        return None
    if drafter == NAME:
        return MAX_NGRAM
    size = drafter[len(NAME) + 1 :]
    if not size.isdigit() or int(size) < 1:
        raise ValueError(f"drafter {drafter!r}: give {NAME} or {NAME}:<largest n-gram, an integer >= 1>")
    return int(size)


def _embedded(model: str | None) -> bool:
    from .embedded import EMBEDDED

    return model is None or model in EMBEDDED


def pair_name(drafter: str | None, verifier: str, dtype: str = "bfloat16") -> str:
    """The transformers pair's name (``relaxtune.backends.hf.load_pair``'s ``backend.name``)."""

    def short(model: str | None) -> str:
        local = not _embedded(model) and (model.startswith((".", "/", "~")) or os.path.exists(model))
        return os.path.abspath(os.path.expanduser(model)) if local else str(model)

    name = f"{short(drafter)}->{short(verifier)}"
    return name if dtype == "bfloat16" else f"{name}@{dtype}"


def gguf_pair_name(drafter: str | None, verifier: str) -> str:
    """The llama.cpp pair's name (``relaxtune.backends.llamacpp.load_gguf_pair``'s)."""

    def short(model: str | None) -> str:
        if _embedded(model) or parse_lookup(model) is not None:  # prompt lookup: no file
            return str(model)
        return str(Path(os.path.expanduser(model)).resolve())

    return f"{short(drafter)}->{short(verifier)}@{LLAMACPP}"


def server_pair_name(drafter: str | None, verifier: str) -> str:
    """The SGLang backend's name: the models as the job names them."""
    return f"sglang-{drafter}->{verifier}"


def lookup_name(verifier_name: str) -> str:
    """The default name of prompt lookup around a verifier backend named ``verifier_name``."""
    return f"{NAME}->{verifier_name}"
