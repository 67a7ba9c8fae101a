"""When relaxtune was first imported in this process (``STARTED``, ``time.monotonic()`` seconds),
before the decoding core, torch and the rest: where a command's "imports" phase starts
(``relaxtune.tune.phases.process_age``). The process's own start time is not that: a shell
that ends with ``... && relaxtune tune`` execs the command in its own process, whose clock
then also holds what ran before it (an install, say)."""

import time

STARTED = time.monotonic()
