"""Starting SGLang servers: the pinned-version check and the launch flags, run
for real against a fake ``sglang`` package (a health endpoint, no model)."""

import json
import sys
import textwrap

import httpx
import pytest
from typer.testing import CliRunner

from relaxtune.backends.sglang_launch import SGLANG_VERSION, ServerSpec, check_sglang, launch
from relaxtune.backends.sglang_native import DETERMINISTIC
from relaxtune.cli import app

LAUNCH_SERVER = textwrap.dedent('''
    """A fake ``python -m sglang.launch_server``: records its argv, then serves /health
    (or exits with FAKE_SGLANG_EXIT)."""
    import http.server, json, os, pathlib, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    pathlib.Path(os.environ["FAKE_SGLANG_DIR"], f"argv-{port}.json").write_text(json.dumps(sys.argv[1:]))
    if os.environ.get("FAKE_SGLANG_EXIT"):
        sys.exit(int(os.environ["FAKE_SGLANG_EXIT"]))

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
''')


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    """Put a fake ``sglang`` of a given version on the path of every child Python."""

    def install(version=SGLANG_VERSION, exit_code=None):
        pkg = tmp_path / "site" / "sglang"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
        (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
        monkeypatch.setenv("FAKE_SGLANG_DIR", str(tmp_path))
        if exit_code is not None:
            monkeypatch.setenv("FAKE_SGLANG_EXIT", str(exit_code))
        return tmp_path

    return install


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_pinned_version_passes_and_another_is_refused_by_name(fake_sglang):
    fake_sglang(SGLANG_VERSION)
    assert check_sglang(sys.executable) == SGLANG_VERSION
    fake_sglang("0.5.24")
    with pytest.raises(RuntimeError, match=rf"SGLang 0.5.24 is installed .* sglang=={SGLANG_VERSION} .* pip install "
                                           rf"'sglang=={SGLANG_VERSION}', or pass --allow-other-sglang"):
        check_sglang(sys.executable)
    with pytest.warns(UserWarning, match="SGLang 0.5.24 is installed"):
        assert check_sglang(sys.executable, allow_other_version=True) == "0.5.24"


def test_missing_sglang_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # nothing called sglang there, nor in the test venv
    with pytest.raises(RuntimeError, match=r"SGLang is not installed for .*pip install 'relaxtune\[sglang\]'"):
        check_sglang(sys.executable)


def test_launch_waits_for_health_and_stops_the_servers(fake_sglang):
    fake_sglang()
    port = _free_port()
    with launch([ServerSpec("some/model", port)], timeout=60) as urls:
        assert urls == [f"http://127.0.0.1:{port}"]
        assert httpx.get(f"{urls[0]}/health").status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_serve_launches_the_speculative_server_deterministic(fake_sglang):
    root = fake_sglang(exit_code=3)  # each fake server records its flags and exits: serve reports it
    port = _free_port()
    out = CliRunner().invoke(app, ["serve", "--drafter", "d/m", "--verifier", "v/m", "--port", str(port),
                                   "--native-threshold", "0.4", "-n", "3"])
    assert out.exit_code == 1 and "exited with code 3" in out.output
    argv = json.loads((root / f"argv-{port + 2}.json").read_text())
    assert DETERMINISTIC in argv and argv[argv.index("--speculative-accept-threshold-acc") + 1] == "0.4"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    assert DETERMINISTIC not in json.loads((root / f"argv-{port}.json").read_text())  # plain servers: no need


def test_serve_refuses_another_sglang_version(fake_sglang):
    fake_sglang("0.5.9")
    out = CliRunner().invoke(app, ["serve", "--drafter", "d/m", "--verifier", "v/m"], env={"COLUMNS": "300"})
    assert out.exit_code == 1 and "SGLang 0.5.9 is installed" in out.output and "--allow-other-sglang" in out.output
