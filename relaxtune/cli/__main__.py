"""``python -m relaxtune.cli``: the same as the ``relaxtune`` command."""

from . import main

main()
