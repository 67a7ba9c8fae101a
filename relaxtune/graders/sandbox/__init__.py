"""The code sandbox: a harness that runs every test of one solution in contained
child processes (``harness.py`` and ``child.py``, standard library only), started
under bubblewrap (``bwrap.py``) inside a control group of its own (``cgroup.py``)
by the launcher, which reads its verdict with bounded memory and time
(``launcher.py``); the comparisons both share with the official graders
(``checks.py``), the harness's process primitives (``confine.py``) and the one
interpreter and package directory both containments give solutions (``packages.py``)."""

from .launcher import Outcome, SandboxInfo, budget, read_capped, run_job, sandbox_info

__all__ = ["Outcome", "SandboxInfo", "budget", "read_capped", "run_job", "sandbox_info"]
