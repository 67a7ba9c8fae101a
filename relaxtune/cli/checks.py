"""Checks of a command's inputs that need no model and write nothing, run before any model
loads or converts (and, for ``serve``, before any server starts): each refusal is a
``typer.BadParameter`` (exit code 2) naming the flag and the value."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import typer

__all__ = [
    "check_model",
    "check_hub_id",
    "check_pair",
    "check_folder",
    "check_file_target",
    "check_python",
    "check_job",
]


def _looks_local(model: str) -> bool:
    """A path rather than a hub id or an embedded name: it starts like one, names a
    GGUF file, or exists."""
    return model.startswith((".", "/", "~")) or model.endswith(".gguf") or os.path.exists(model)


def check_model(flag: str, model: str | None, runtime: str) -> None:
    """``model`` can be what ``flag`` names on ``runtime`` (``hf`` or ``llamacpp``), as far as
    can be told without loading it: an embedded name, prompt lookup (drafter), an existing
    folder (transformers) or ``.gguf`` file (llama.cpp), or (transformers) a hub id.

    Raises:
        typer.BadParameter: an empty name, a path that does not exist, a file where
            transformers needs a folder, or anything but a GGUF file or an embedded name on llama.cpp.
    """
    from ..backends.embedded import EMBEDDED
    from ..backends.lookup import parse_lookup

    if model is None:
        return
    if not model.strip():
        raise typer.BadParameter(
            f"{flag} is empty; give an embedded name ({', '.join(EMBEDDED)}), a folder or a hub id"
        )
    if model in EMBEDDED:
        return
    try:
        if flag == "--drafter" and parse_lookup(model) is not None:
            return
    except ValueError as err:
        raise typer.BadParameter(f"{flag} {model}: {err}") from None
    path = Path(os.path.expanduser(model))
    names = f"embedded names: {', '.join(EMBEDDED)}"
    if runtime == "llamacpp":
        if not path.is_file():
            raise typer.BadParameter(
                f"{flag} {model}: no such GGUF file (the llama.cpp runtime loads .gguf files or {names})"
            )
        return
    if _looks_local(model):
        if not path.exists():
            raise typer.BadParameter(
                f"{flag} {model}: no such folder (give a model folder with config.json, a hub "
                f"id, or one of the {names})"
            )
        if not path.is_dir():
            raise typer.BadParameter(
                f"{flag} {model}: a file, not a model folder (a .gguf file needs --runtime llamacpp)"
            )
        if not (path / "config.json").is_file():
            raise typer.BadParameter(f"{flag} {model}: a folder without config.json, not a transformers model folder")
        return
    parts = model.split("/")
    if len(parts) > 2 or any(not p or p.startswith("-") or ".." in p or " " in p for p in parts):
        raise typer.BadParameter(f"{flag} {model!r}: neither a folder, a hub id (org/name) nor one of the {names}")
    check_hub_id(flag, model)


def check_hub_id(flag: str, repo: str, files: tuple[str, ...] = ("config.json",)) -> None:
    """The hub model ``repo`` can be loaded: one of its ``files`` is in the Hugging Face
    cache, or the hub answers (within 10 s) that the model exists. Asked before any
    model loads, so a typo costs no conversion of the other model.

    Raises:
        typer.BadParameter: not cached and offline (``HF_HUB_OFFLINE``), not cached and
            the hub cannot be reached, or no such model on the hub (or a private one
            without a token).
    """
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError

    try:
        if any(isinstance(huggingface_hub.try_to_load_from_cache(repo, file), str) for file in files):
            return
    except HFValidationError as err:
        raise typer.BadParameter(f"{flag} {repo!r}: not a hub id ({err})") from None
    fix = f"download it (`hf download {repo}`), or give a model folder"
    if huggingface_hub.is_offline_mode():
        raise typer.BadParameter(f"{flag} {repo}: not in the Hugging Face cache and HF_HUB_OFFLINE is set; {fix}")
    try:
        huggingface_hub.HfApi().model_info(repo, timeout=10)
    except GatedRepoError:
        return  # it exists; its download asks for the token
    except RepositoryNotFoundError:
        raise typer.BadParameter(
            f"{flag} {repo}: no such model on the Hugging Face hub (a typo? a private model needs `hf auth login`)"
        ) from None
    except Exception as err:  # no route to the hub: its download would fail the same way, later
        raise typer.BadParameter(
            f"{flag} {repo}: not in the Hugging Face cache and the hub cannot be reached ({type(err).__name__}); {fix}"
        ) from None


def check_pair(pair, *, drafter: bool = True) -> str:
    """The runtime ``pair`` (``PairSettings``) runs on, resolved, after ``check_model`` of
    its models (the drafter too when ``drafter``) and its tokenizer; SGLang servers run
    the models elsewhere, so their names are not checked as paths.

    Raises:
        typer.BadParameter: as ``check_model``, or a runtime that cannot run this pair.
    """
    from ..backends.lookup import parse_lookup

    try:
        parse_lookup(pair.drafter)
    except ValueError as err:
        raise typer.BadParameter(f"--drafter {pair.drafter}: {err}") from None
    try:
        runtime = pair.resolved_runtime()
    except ValueError as err:
        raise typer.BadParameter(f"--runtime {pair.runtime}: {err}") from None
    lookup = parse_lookup(pair.drafter) is not None
    # the same pairing rules load_backend applies (it applies them only once the task's files are written)
    if lookup and pair.drafter_url:
        raise typer.BadParameter(
            f"--drafter-url {pair.drafter_url}: --drafter {pair.drafter} drafts without a model; "
            "give --verifier-url alone"
        )
    if not lookup and bool(pair.drafter_url) != bool(pair.verifier_url):
        given = "--drafter-url " + pair.drafter_url if pair.drafter_url else "--verifier-url " + pair.verifier_url
        raise typer.BadParameter(f"{given}: the SGLang backend needs both --drafter-url and --verifier-url")
    if pair.native_url and not pair.verifier_url:
        raise typer.BadParameter(
            f"--native-url {pair.native_url}: needs --drafter-url and --verifier-url too "
            "(strict, the baseline, runs on them)"
        )
    if pair.native_url and lookup:
        raise typer.BadParameter(
            f"--native-url {pair.native_url}: SGLang's speculative server drafts with its own "
            f"drafter model, not --drafter {pair.drafter}"
        )
    if pair.tokenizer and _looks_local(pair.tokenizer):
        folder = Path(os.path.expanduser(pair.tokenizer))
        if not folder.exists():
            raise typer.BadParameter(f"--tokenizer {pair.tokenizer}: no such file or folder")
        if folder.is_dir() and not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise typer.BadParameter(
                f"--tokenizer {pair.tokenizer}: a folder without tokenizer.json or tokenizer_config.json"
            )
    if pair.tokenizer and not _looks_local(pair.tokenizer):
        check_hub_id("--tokenizer", pair.tokenizer, ("tokenizer_config.json", "tokenizer.json", "config.json"))
    if pair.verifier_url or pair.drafter_url:
        return runtime
    check_model("--verifier", pair.verifier, runtime)
    if drafter:
        check_model("--drafter", pair.drafter, runtime)
    return runtime


def check_folder(flag: str, folder: str, shown: str | None = None) -> None:
    """``folder`` is a folder or can be made one: neither it nor a folder above it is a file,
    and the nearest existing folder on its way takes a new entry (probed with a temporary
    folder, removed at once: nothing is left).

    Raises:
        typer.BadParameter: naming the flag, the value and the file in the way, or why
            nothing can be written there.
    """
    import tempfile

    shown = folder if shown is None else shown  # the value as given (a file's, for a file's folder)
    path = Path(os.path.expanduser(folder)).absolute()
    own = shown == folder  # the folder was given; else a file in it was
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            what = "is a file, not a folder" if part == path and own else f"lies under the file {part}"
            raise typer.BadParameter(f"{flag} {shown}: {what}; give " + ("a folder" if own else "a path in a folder"))
    nearest = next(part for part in (path, *path.parents) if part.exists())
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".relaxtune-probe-", dir=nearest))
    except OSError as err:
        raise typer.BadParameter(
            f"{flag} {shown}: nothing can be written in {nearest} ({err.strerror}); give a folder you can write to"
        ) from None


def check_file_target(flag: str, file: str) -> None:
    """``file`` can be written: not a folder, and no file stands where a folder above it must be.

    Raises:
        typer.BadParameter: naming the flag and the value.
    """
    path = Path(os.path.expanduser(file))
    if path.is_dir():
        raise typer.BadParameter(f"{flag} {file}: a folder; give a file path, e.g. {path / 'tuned.yaml'}")
    check_folder(flag, str(path.parent), shown=file)


def check_python(flag: str, python: str) -> str:
    """``python`` is an executable (a path, or a name on ``$PATH``); its path.

    Raises:
        typer.BadParameter: no such file, or not executable.
    """
    found = (
        shutil.which(python)
        if os.sep not in python
        else (python if os.access(python, os.X_OK) and Path(python).is_file() else None)
    )
    if found is None:
        why = "no such file" if not Path(python).exists() else "not an executable file"
        raise typer.BadParameter(f"{flag} {python}: {why} (give the python of SGLang's environment)")
    return found


def check_job(pair, stores, *, export: bool = False) -> str:
    """Every check of a tuning job's pair (``PairSettings``) and stores (``StoreSettings``)
    that needs no model and writes nothing: the pair (``check_pair``; an export loads no
    model, so its models are not checked), the output folder and the tuned config's path.
    Returns the resolved runtime.

    Raises:
        typer.BadParameter: naming the flag and the value.
    """
    check_folder("--output-dir", stores.output_dir)
    if stores.export:
        check_file_target("--export", stores.export)
    if export:
        try:
            return pair.resolved_runtime()
        except ValueError as err:
            raise typer.BadParameter(f"--runtime {pair.runtime}: {err}") from None
    return check_pair(pair)
