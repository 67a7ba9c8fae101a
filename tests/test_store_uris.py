"""A job's store addresses are checked before any model loads: their form when the
settings are made (in-memory databases and scheme-less strings refused, naming the
flag), and whether the store answers before the backend loads (a closed port, a
silent server, a server that is not MLflow, an unreachable PostgreSQL, a folder that
does not exist), each refused in seconds with the flag it came from."""

import importlib.util
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

import relaxtune.job.steps as job
import relaxtune.report.stores as stores
from relaxtune.cli.app import app
from relaxtune.job.steps import prepare
from relaxtune.report.reexport import JobError
from relaxtune.tune.settings import TuneSettings

from .synthetic import write_task

MEMORY = [
    "sqlite://",
    "sqlite:///",
    "sqlite:///:memory:",
    "sqlite:///file::memory:?cache=shared&uri=true",
    "sqlite:///x.db?mode=memory&uri=true",
]


@pytest.mark.parametrize("field", ["storage", "mlflow_uri"])
@pytest.mark.parametrize(
    "value, match",
    [(m, "in-memory SQLite database") for m in MEMORY]
    + [
        ("notascheme", "is not a URL"),
        ("mlflow.db", "is not a URL"),
        ("", "is not a URL"),
        ("sqlite:///a.db ", "spaces around it"),
        ("SQLITE:///x.db", "in lower case"),
        ("Postgresql://rt@h/x", "in lower case"),
        ("postgres://rt@h/x", "names this database postgresql://"),
    ],
)
def test_store_addresses_of_the_wrong_form_are_refused_with_the_settings(field, value, match):
    with pytest.raises(ValidationError, match=match):
        TuneSettings(task="t", **{field: value})


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("mlflow_uri", "http://", "names no host"),
        ("mlflow_uri", "http://127.0.0.1:notaport", "port is not a number"),
        ("mlflow_uri", "foo://bar", "MLflow keeps runs in sqlite, postgresql, mysql, mssql"),
        ("mlflow_uri", "file:///tmp/mlruns", "file stores read-only"),
        ("storage", "http://127.0.0.1:5000", "not a database"),
    ],
)
def test_a_store_of_the_wrong_kind_is_refused_with_the_settings(field, value, match):
    with pytest.raises(ValidationError, match=match):
        TuneSettings(task="t", **{field: value})


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:///mlflow.db",
        "postgresql://rt@db.example/mlflow",
        "http://127.0.0.1:5000",
        "postgresql+psycopg://rt:pw@db.example:5433/mlflow",
        "HTTPS://mlflow.example.com/",
        "databricks",
    ],
)
def test_store_addresses_of_the_right_form_are_kept(uri):
    assert TuneSettings(task="t", mlflow_uri=uri).mlflow_uri == uri
    # a well-formed URL of a database SQLAlchemy does not know: refused when reached (below)
    assert TuneSettings(task="t", storage="nodialect://x/y").storage == "nodialect://x/y"


def test_the_cli_names_the_flag_of_a_store_address_of_the_wrong_form(tmp_path):
    task = write_task(tmp_path, 4)
    for flag, value in (("--mlflow-uri", "sqlite:///"), ("--storage", "notascheme")):
        out = CliRunner().invoke(app, ["tune", "--task", task, flag, value], env={"COLUMNS": "300"})
        text = " ".join(out.output.split())
        assert out.exit_code == 2 and f"{flag}: " in text, text


@pytest.fixture
def no_model(monkeypatch):
    """The backend must never load: a store check that fails comes first."""

    def load(**_):
        raise AssertionError("the backend loaded")

    monkeypatch.setattr(job, "load_backend", load)
    monkeypatch.setattr(stores, "REACH_TIMEOUT", 2)


def _settings(tmp_path, **over) -> TuneSettings:
    return TuneSettings(
        **(
            {
                "task": write_task(tmp_path / "task", 4),
                "methods": ["cactus"],
                "n_drafts": [4],
                "output_dir": str(tmp_path / "runs"),
            }
            | over
        )
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_store_nobody_answers_fails_before_the_backend_loads_naming_its_flag(tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    port = _closed_port()
    silent = socket.socket()  # accepts connections (the kernel does), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)

    class NotMlflow(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b"<html>not here</html>")

        def log_message(self, *args):
            pass

    other = HTTPServer(("127.0.0.1", 0), NotMlflow)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    missing = tmp_path / "no-such-folder"
    (tmp_path / "a-folder.db").mkdir()
    (tmp_path / "notes.txt").write_text("not a database\n")
    cases = [
        ({"storage": f"sqlite:///{tmp_path}/notes.txt"}, "notes.txt is not an SQLite database"),
        ({"mlflow_uri": f"sqlite:///{tmp_path}/notes.txt"}, "--mlflow-uri .*notes.txt is not an SQLite database"),
        ({"mlflow_uri": f"http://me:s3cret@127.0.0.1:{port}"}, f"--mlflow-uri http://me:\\*\\*\\*@127.0.0.1:{port}: "),
        ({"storage": f"sqlite:///{tmp_path}/a-folder.db"}, "a-folder.db is a folder"),
        (
            {"mlflow_uri": f"http://127.0.0.1:{port}"},
            f"--mlflow-uri http://127.0.0.1:{port}: no MLflow tracking "
            "server answers there within 2 s \\(connection refused\\)",
        ),
        (
            {"mlflow_uri": f"http://127.0.0.1:{silent.getsockname()[1]}"},
            "no MLflow tracking server answers there within 2 s \\(timed out\\)",
        ),
        (
            {"mlflow_uri": f"http://127.0.0.1:{other.server_port}"},
            "a server answers there, but not as an MLflow tracking server .*HTTP 404",
        ),
        (
            {"mlflow_uri": f"postgresql://rt@127.0.0.1:{port}/mlflow"},
            f"--mlflow-uri postgresql://rt@127.0.0.1:{port}/"
            "mlflow: the database does not accept a "
            "connection within 2 s",
        ),
        ({"storage": f"postgresql://rt:secret@127.0.0.1:{port}/optuna"}, "--storage postgresql://rt:\\*\\*\\*@127"),
        (
            {"storage": f"sqlite:///{missing}/optuna.db"},
            f"--storage sqlite:///{missing}/optuna.db: the folder {missing} does not exist",
        ),
        ({"mlflow_uri": f"sqlite:///{missing}/mlflow.db"}, f"--mlflow-uri .*: the folder {missing} does not exist"),
        ({"storage": "nodialect://x/y"}, "--storage nodialect://x/y: NoSuchModuleError"),
    ]
    if importlib.util.find_spec("MySQLdb") is None:
        cases.append(({"mlflow_uri": "mysql://u@127.0.0.1/x"}, "driver is missing .*install a MySQL driver"))
    try:
        for over, match in cases:
            with pytest.raises(JobError, match=match) as refused:
                prepare(_settings(tmp_path, **over), log=lambda m: None)
            assert "s3cret" not in str(refused.value)
            assert not missing.exists()  # a typo never creates folders
        with pytest.raises(JobError, match="--mlflow-uri"):  # nothing is made for a wrong address, not even the
            prepare(
                _settings(tmp_path, output_dir=str(missing / "runs"), mlflow_uri=f"http://127.0.0.1:{port}"),
                log=lambda m: None,
            )  # default storage's output folder
        assert not missing.exists()
    finally:
        silent.close()
        other.shutdown()
    # the stores a job makes itself pass: the storage in the output folder it creates, MLflow's default in the
    # working folder; then the backend loads (here: the check that it comes last)
    with pytest.raises(AssertionError, match="the backend loaded"):
        prepare(_settings(tmp_path / "fresh"), log=lambda m: None)
    with pytest.raises(AssertionError, match="the backend loaded"):  # a job without tracking never reaches MLflow
        prepare(_settings(tmp_path, mlflow_uri=f"http://127.0.0.1:{port}"), log=lambda m: None, track=False)
