"""The name of a model pair in records and study names, known without loading anything.

One function per form, every backend's name built here:

- in-process transformers (``hf``): ``<drafter>-><verifier>``, embedded names and hub
  ids as given, local folders by absolute path, ``@<dtype>`` unless bfloat16;
- llama.cpp (``llamacpp``): ``<drafter>-><verifier>@llamacpp``, embedded names and
  ``prompt-lookup`` as given, files by resolved absolute path (records and studies of
  the two runtimes never mix);
- SGLang servers: ``sglang-<drafter>-><verifier>`` as the job names the models;
- prompt lookup wrapped around a loaded verifier backend: ``prompt-lookup-><its name>``.

Changing a form here renames every record folder and study of that form: earlier runs
would no longer resume.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pair_name", "gguf_pair_name", "server_pair_name", "lookup_name", "LLAMACPP"]

LLAMACPP = "llamacpp"


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
    from .lookup import parse_lookup

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
    from .lookup import NAME

    return f"{NAME}->{verifier_name}"
