"""The code sandbox: a harness that runs every test of one solution in contained
child processes (``harness.py``, standard library only), the launcher that starts
it and reads its verdict with bounded memory and time (``launcher.py``), and the
comparisons both share with the official graders (``checks.py``)."""

from .launcher import Outcome, SandboxInfo, read_capped, run_job, sandbox_info

__all__ = ["Outcome", "SandboxInfo", "read_capped", "run_job", "sandbox_info"]
