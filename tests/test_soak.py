"""The soak test's short form (``python -m relaxtune.bench.soak``): workers started at the same
instant on fresh stores (SQLite, then PostgreSQL when it answers), one SIGKILLed, one restarted."""

import shutil

import pytest

from relaxtune.bench import soak

from .conftest import PG_ADMIN, _pg_reachable

pytestmark = pytest.mark.soak


def test_two_rounds_of_workers_from_a_cold_start_one_killed(capsys):
    postgres = ["--postgres", PG_ADMIN] if shutil.which("pg_ctlcluster") and _pg_reachable() is None else []
    assert soak.main(["--rounds", "2", "--seed", "7", "--kill-window", "6"] + postgres) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "0 generated twice, 0 round(s) failed" in out and out.count(" ok\n") == 2
