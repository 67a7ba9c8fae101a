"""The serving batch sizes a job's cost profile is measured at, resolved on this machine:
``--serving-batch-sizes auto`` (``auto_batch_sizes``) and llama.cpp's sequence slots,
above which a size cannot be measured (``check_slots``). The sizes' fields and their
checks are ``relaxtune.tune.setting_groups.StatsSettings``'.
"""

from __future__ import annotations

from .setting_groups import PairSettings

__all__ = ["auto_batch_sizes", "check_slots"]


def check_slots(pair: PairSettings, sizes: list[int] | str, declared=()) -> None:
    """Refuse serving batch sizes above llama.cpp's sequence slots (its contexts'
    ``n_seq_max``: ``--batch-size``, default ``BATCH_SIZE_LLAMACPP``): they cannot be measured.
    ``declared``: the declared or weighted sizes (``StatsSettings.serving_weights``' keys),
    measured too; with ``sizes`` auto they are the ones checked (auto itself stays within
    the slots).

    Raises:
        ValueError: naming the flags that fix it.
    """
    from ..backends.llamacpp import BATCH_SIZE_LLAMACPP, MAX_SEQUENCES

    slots = pair.batch_size or BATCH_SIZE_LLAMACPP
    if slots > MAX_SEQUENCES:
        raise ValueError(f"--batch-size {slots}: llama.cpp's contexts hold at most {MAX_SEQUENCES} sequences")
    if sizes == "auto" and declared and max(declared) > slots:
        largest = max(declared)
        fix = f", or --batch-size {largest}" if largest <= MAX_SEQUENCES else ""
        raise ValueError(
            f"--serving-batch-size/--serving-batch-weights: batch size {largest} is measured too, but llama.cpp's "
            f"contexts hold {slots} sequences (--batch-size {pair.batch_size or f'default {slots} on llama.cpp'}; "
            f"at most {MAX_SEQUENCES}): give sizes up to {slots}{fix}"
        )
    if sizes != "auto" and max(sizes) > slots:
        shown = ",".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]},...,{sizes[-1]}"
        fix = f", or --batch-size {max(sizes)}" if max(sizes) <= MAX_SEQUENCES else ""
        raise ValueError(
            f"--serving-batch-sizes {shown}: llama.cpp's contexts hold {slots} sequences "
            f"(--batch-size {pair.batch_size or f'default {slots} on llama.cpp'}; at most {MAX_SEQUENCES}), so "
            f"batch size {max(sizes)} cannot be measured: give sizes up to {slots}{fix}"
        )


def auto_batch_sizes(pair: PairSettings, runtime: str) -> list[int]:
    """``--serving-batch-sizes auto`` on this machine
    (``relaxtune.decoding.serving.default_batch_sizes``): llama.cpp's (a CPU's) for
    ``runtime`` llamacpp, at most its contexts' sequence slots (``--batch-size``, default
    ``BATCH_SIZE_LLAMACPP``); else a GPU's when this machine has CUDA (the transformers
    runtime loads there), else a CPU's; SGLang servers: the device the verifier server
    reports (``relaxtune.backends.sglang_costs.server_batch_sizes``)."""
    from ..decoding.serving import default_batch_sizes

    if pair.verifier_url:
        from ..backends.sglang_costs import server_batch_sizes

        return list(server_batch_sizes(pair.verifier_url))
    if runtime == "llamacpp":
        from ..backends.llamacpp import BATCH_SIZE_LLAMACPP

        slots = pair.batch_size or BATCH_SIZE_LLAMACPP
        return [b for b in default_batch_sizes("llamacpp") if b <= slots]
    import torch

    return list(default_batch_sizes("cuda" if torch.cuda.is_available() else "cpu"))
