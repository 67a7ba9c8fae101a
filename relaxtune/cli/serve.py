"""``serve``: start SGLang servers on a GPU host or a CPU host."""

from __future__ import annotations

import sys
from typing import Literal

import typer

from .app import app, console
from .checks import check_folder, check_model, check_python
from .options import finite, setting_option

CPU_NATIVE_REFUSED = (
    "--native-threshold needs SGLang's own speculative decoding, which cannot run on a CPU host: its scheduler dies "
    'with "EAGLE is not supported in decode attention backend torch_native" (only the intel_amx backend serves '
    "drafts on CPU), and --enable-deterministic-inference, which the speculative server needs for reproducible "
    "samples, is refused on every CPU. Run it on a GPU host (scripts/gpu_check.sh checks one); the relaxed methods, "
    "sglang_threshold included, run here over the two plain servers."
)


@app.command()
def serve(
    drafter: str = setting_option("drafter", default=...),
    verifier: str = setting_option("verifier", default=...),
    port: int = typer.Option(
        30000, help="drafter port; the verifier gets port + 1 (and the speculative server port + 2)"
    ),
    python: str = typer.Option(
        sys.executable,
        help="the python of SGLang's own environment (it pins its own "
        "torch; scripts/sglang_env.sh builds one for a CPU host)",
    ),
    device: Literal["auto", "cpu", "cuda"] = typer.Option(
        "auto", help="cpu, cuda, or auto (cuda where an NVIDIA GPU is visible)"
    ),
    mem_fraction: float = typer.Option(0.4, callback=finite, help="static GPU memory fraction per server"),
    timeout: float = typer.Option(900.0, callback=finite, help="seconds each server may take to become ready"),
    log_dir: str | None = typer.Option(None, help="write the servers' logs here"),
    native_threshold: float | None = typer.Option(
        None,
        min=0.0,
        max=1.0,
        callback=finite,
        help="also start a STANDALONE speculative server (port + 2) running SGLang's "
        "own relaxation at this threshold, for the sglang_threshold method (GPU hosts only)",
    ),
    n_draft: int = typer.Option(4, "--n-draft", "-n", min=1, help="draft length N of the speculative server"),
    allow_other_sglang: bool = typer.Option(
        False, help="run an SGLang other than the pinned version (its responses may differ from what relaxtune reads)"
    ),
) -> None:
    """Start a drafter and a verifier SGLang server on loopback and keep them up until
    Ctrl-C or SIGTERM, then stop them (every process of each server).

    Checks first that SGLang's environment has the pinned version. On a CPU host the
    servers run SGLang's CPU engine (with relaxtune's pure-torch ``sgl_kernel`` stand-in,
    unless the CPU has AMX and SGLang's environment a compiled CPU build of the kernels).
    The speculative server (``--native-threshold``, GPU only) runs with
    ``--enable-deterministic-inference``: without it SGLang ignores the requests' seeds."""
    import signal
    import time

    from ..backends.hf import resolve_model_path
    from ..backends.sglang_launch import ServerSpec, host_device, launch
    from ..backends.sglang_native import native_flags

    if not 1 <= port <= 65533:
        raise typer.BadParameter(f"--port {port}: give a port in 1-65533 (the servers take port, port + 1, port + 2)")
    if not 0 < mem_fraction <= 1:
        raise typer.BadParameter(f"--mem-fraction {mem_fraction}: give a share in (0, 1]")
    if timeout <= 0:
        raise typer.BadParameter(f"--timeout {timeout}: give a number of seconds > 0")
    python = check_python("--python", python)  # before any model converts or server starts
    check_model("--drafter", drafter, "hf")  # SGLang loads folders and hub ids, as transformers does
    check_model("--verifier", verifier, "hf")
    if log_dir is not None:
        check_folder("--log-dir", log_dir)
    device = host_device() if device == "auto" else device
    if native_threshold is not None and device == "cpu":
        console.print(CPU_NATIVE_REFUSED, style="red", markup=False)
        raise typer.Exit(1)
    try:  # SGLang loads a folder or a hub id: an embedded name becomes its converted folder
        d_path, v_path = resolve_model_path(drafter), resolve_model_path(verifier)
    except (FileNotFoundError, ImportError, ValueError) as err:
        console.print(str(err), style="red", markup=False)
        raise typer.Exit(1) from None
    specs = [ServerSpec(d_path, port, mem_fraction), ServerSpec(v_path, port + 1, mem_fraction)]
    if native_threshold is not None:
        specs[0] = ServerSpec(d_path, port, mem_fraction / 2)  # the drafter is small
        specs.append(
            ServerSpec(
                v_path,
                port + 2,
                mem_fraction,
                ("--speculative-draft-model-path", d_path, *native_flags(native_threshold, n_draft)),
            )
        )

    def stop(signum, frame):  # SIGTERM and SIGHUP stop the servers as Ctrl-C does
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    console.print(f"starting SGLang on {device} from {python} (the first start takes minutes on a CPU)")
    try:
        with launch(
            specs,
            python=python,
            timeout=timeout,
            log_dir=log_dir,
            allow_other_version=allow_other_sglang,
            device=device,
        ) as urls:
            d_url, v_url = urls[:2]
            native = f" --native-url {urls[2]} --methods sglang_threshold" if len(urls) > 2 else ""
            console.print(
                f"drafter  {d_url}\nverifier {v_url}\n"
                + (f"speculative {urls[2]}\n" if native else "")
                + f"tune with: relaxtune tune --drafter-url {d_url} --verifier-url {v_url}{native} "
                f"--drafter {drafter} --verifier {verifier} --task ...   (Ctrl-C stops the servers)",
                markup=False,
            )
            while True:
                time.sleep(3600)
    except RuntimeError as err:
        console.print(str(err), style="red", markup=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("servers stopped")
