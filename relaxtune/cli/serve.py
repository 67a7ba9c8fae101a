"""``serve``: start SGLang servers on a GPU host."""

from __future__ import annotations

from typing import Optional

import typer

from .app import app, console


@app.command()
def serve(
    drafter: str = typer.Option(..., help="drafter model path or hub id"),
    verifier: str = typer.Option(..., help="verifier model path or hub id"),
    port: int = typer.Option(30000, help="drafter port; the verifier gets port + 1"),
    mem_fraction: float = typer.Option(0.4, help="static GPU memory fraction per server"),
    log_dir: Optional[str] = typer.Option(None, help="write the servers' logs here"),
    native_threshold: Optional[float] = typer.Option(
        None, min=0.0, max=1.0, help="also start a STANDALONE speculative server (port + 2) running SGLang's "
        "own relaxation at this threshold, for the sglang_threshold method"),
    n_draft: int = typer.Option(4, "--n-draft", "-n", min=1, help="draft length N of the speculative server"),
    allow_other_sglang: bool = typer.Option(False, help="run an SGLang other than the pinned version (its responses "
                                            "may differ from what relaxtune reads)"),
) -> None:
    """Start a drafter and a verifier SGLang server on loopback and keep them up until Ctrl-C.

    Checks first that the installed SGLang is the pinned version. The
    speculative server (``--native-threshold``) runs with
    ``--enable-deterministic-inference``: without it SGLang ignores the
    requests' seeds."""
    import time

    from ..backends.sglang_launch import ServerSpec, launch
    from ..backends.sglang_native import native_flags

    specs = [ServerSpec(drafter, port, mem_fraction), ServerSpec(verifier, port + 1, mem_fraction)]
    if native_threshold is not None:
        specs[0] = ServerSpec(drafter, port, mem_fraction / 2)  # the drafter is small
        specs.append(ServerSpec(verifier, port + 2, mem_fraction,
                                ("--speculative-draft-model-path", drafter, *native_flags(native_threshold, n_draft))))
    try:
        with launch(specs, log_dir=log_dir, allow_other_version=allow_other_sglang) as urls:
            d_url, v_url = urls[:2]
            native = f" --native-url {urls[2]} --methods sglang_threshold" if len(urls) > 2 else ""
            console.print(f"drafter  {d_url}\nverifier {v_url}\n" + (f"speculative {urls[2]}\n" if native else "")
                          + f"tune with: relaxtune tune --drafter-url {d_url} --verifier-url {v_url}{native} "
                          f"--drafter {drafter} --verifier {verifier} --task ...   (Ctrl-C stops the servers)")
            while True:
                time.sleep(3600)
    except RuntimeError as err:
        console.print(str(err), style="red", markup=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("servers stopped")
