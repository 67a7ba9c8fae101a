"""Starting SGLang servers: the pinned-version check and the launch flags, run
for real against a fake ``sglang`` package (a health endpoint, no model)."""

import json
import os
import sys
import textwrap

import httpx
import pytest
from typer.testing import CliRunner

from relaxtune.backends.sglang_launch import SGLANG_VERSION, ServerSpec, check_sglang, launch
from relaxtune.backends.sglang_native import DETERMINISTIC
from relaxtune.cli import app

from .hub_cache import cache_hub_model

LAUNCH_SERVER = textwrap.dedent('''
    """A fake ``python -m sglang.launch_server``: records its argv, environment and the pid of
    a child it starts (as SGLang starts its scheduler), then serves /health (503 with
    FAKE_SGLANG_NEVER_READY), or exits with FAKE_SGLANG_EXIT after a line of log."""
    import http.server, json, os, pathlib, subprocess, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pathlib.Path(os.environ["FAKE_SGLANG_DIR"], f"argv-{port}.json").write_text(json.dumps(
        {"argv": sys.argv[1:], "env": dict(os.environ), "child": child.pid}))
    if os.environ.get("FAKE_SGLANG_EXIT"):
        print("ValueError: the model folder has no config.json", flush=True)
        child.kill()
        sys.exit(int(os.environ["FAKE_SGLANG_EXIT"]))

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ready = self.path == "/health" and not os.environ.get("FAKE_SGLANG_NEVER_READY")
            self.send_response(200 if ready else 503 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
''')


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    """Put a fake ``sglang`` of a given version on the path of every child Python."""

    import huggingface_hub.constants

    hub = tmp_path / "hub"  # the models served, d/m and v/m, are hub ids the cache holds
    for repo in ("d/m", "v/m"):
        cache_hub_model(hub, repo)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))  # a child `relaxtune serve` too

    def install(version=SGLANG_VERSION, exit_code=None, never_ready=False):
        pkg = tmp_path / "site" / "sglang"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
        (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
        monkeypatch.setenv("FAKE_SGLANG_DIR", str(tmp_path))
        if exit_code is not None:
            monkeypatch.setenv("FAKE_SGLANG_EXIT", str(exit_code))
        if never_ready:
            monkeypatch.setenv("FAKE_SGLANG_NEVER_READY", "1")
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
    with pytest.raises(
        RuntimeError,
        match=rf"SGLang 0.5.24 is installed .* sglang=={SGLANG_VERSION} .* pip install "
        rf"'sglang=={SGLANG_VERSION}', or pass --allow-other-sglang",
    ):
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
    out = CliRunner().invoke(
        app,
        [
            "serve",
            "--drafter",
            "d/m",
            "--verifier",
            "v/m",
            "--port",
            str(port),
            "--native-threshold",
            "0.4",
            "-n",
            "3",
            "--device",
            "cuda",
        ],
    )
    assert out.exit_code == 1 and "exited with code 3" in out.output
    argv = json.loads((root / f"argv-{port + 2}.json").read_text())["argv"]
    assert DETERMINISTIC in argv and argv[argv.index("--speculative-accept-threshold-acc") + 1] == "0.4"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    assert DETERMINISTIC not in json.loads((root / f"argv-{port}.json").read_text())["argv"]  # plain servers: no need


def test_serve_refuses_another_sglang_version(fake_sglang):
    fake_sglang("0.5.9")
    out = CliRunner().invoke(app, ["serve", "--drafter", "d/m", "--verifier", "v/m"], env={"COLUMNS": "300"})
    assert out.exit_code == 1 and "SGLang 0.5.9 is installed" in out.output and "--allow-other-sglang" in out.output


def _gone(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie that nobody reaped yet is gone too
        return f.read().split(") ")[1].startswith("Z")


def test_cpu_servers_get_the_cpu_engine_the_flags_and_the_kernel_stand_in_without_amx():
    from relaxtune.backends.sglang_cpu import KERNEL_DIR
    from relaxtune.backends.sglang_launch import CPU_FLAGS, server_env

    cmd = ServerSpec("m", 31000).command("/env/bin/python", "cpu")
    assert cmd[:3] == ["/env/bin/python", "-m", "sglang.launch_server"]
    assert cmd[-len(CPU_FLAGS) :] == list(CPU_FLAGS) and "--mem-fraction-static" not in cmd
    assert "--context-length" in cmd and "--disable-overlap-schedule" in cmd
    gpu = ServerSpec("m", 31000, 0.3).command("/env/bin/python", "cuda")
    assert gpu[gpu.index("--mem-fraction-static") + 1] == "0.3" and "--disable-overlap-schedule" not in gpu
    env = server_env("cpu", {"PYTHONPATH": "/a"}, amx=False)
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["PYTHONPATH"] == f"{KERNEL_DIR}:/a"
    assert (KERNEL_DIR / "sgl_kernel" / "__init__.py").is_file()
    assert server_env("cpu", {}, amx=True, kernel=True) == {"SGLANG_USE_CPU_ENGINE": "1"}  # a real CPU build runs
    # AMX but no compiled CPU build (PyPI has none): SGLang still imports sgl_kernel, so the stand-in goes first
    assert server_env("cpu", {}, amx=True, kernel=False)["PYTHONPATH"] == str(KERNEL_DIR)
    assert server_env("cuda", {"PYTHONPATH": "/a"}) == {"PYTHONPATH": "/a"}


@pytest.mark.parametrize(
    "package, real",
    [
        (None, False),  # no sgl_kernel at all (scripts/sglang_env.sh's environment)
        ("raise ImportError('libcuda.so.1: cannot open shared object file')", False),  # the CUDA build on a CPU host
        ("import torch", False),  # imports, but without SGLang's AMX op (as the stand-in)
        (
            "import torch\nlib = torch.library.Library('sgl_kernel', 'DEF')\n"
            "lib.define('convert_weight_packed(Tensor weight) -> Tensor')",
            True,
        ),  # a compiled CPU build registers it
        ("import sys\nsys.exit(0)", False),  # exits 0 before the op is looked up: no yes without the probe's mark
        ("import os\nos._exit(0)", False),
    ],
)
def test_a_compiled_cpu_kernel_is_told_from_none_a_cuda_build_and_a_stand_in(tmp_path, package, real):
    from relaxtune.backends.sglang_cpu import has_cpu_kernel

    if package is not None:
        (tmp_path / "sgl_kernel").mkdir()
        (tmp_path / "sgl_kernel" / "__init__.py").write_text(package + "\n")
    assert has_cpu_kernel(sys.executable, str(tmp_path)) is real


def test_the_kernel_probe_needs_its_mark_and_never_reads_the_terminal(tmp_path, monkeypatch):
    from relaxtune.backends.sglang_cpu import has_cpu_kernel

    assert has_cpu_kernel("/bin/true") is False  # not a Python, exits 0
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text(
        "import torch\nlib = torch.library.Library('sgl_kernel', 'DEF')\n"
        "lib.define('convert_weight_packed(Tensor weight) -> Tensor')\n"
    )
    monkeypatch.setenv("PYTHONINSPECT", "1")  # after -c, a >>> prompt on whatever stdin the probe has
    read, write = os.pipe()  # this process's stdin: open, never written (as a terminal nobody types into)
    saved = os.dup(0)
    os.dup2(read, 0)
    try:
        assert has_cpu_kernel(sys.executable, str(tmp_path), timeout=60.0) is True  # not a False after 60 s
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)


@pytest.mark.parametrize(
    "flags, amx",
    [
        ("flags\t\t: fpu vme amx_bf16 amx_tile amx_int8\n", True),
        ("flags\t\t: amx_tile fpu\n", True),  # first in the list
        ("flags\t\t:fpu\tamx_tile\n", True),  # no space after the colon, a tab between flags
        ("flags\t\t: fpu amx_tile_ext amx_bf16\n", False),  # another flag that starts with it
        ("model name\t: Intel(R) Xeon(R) amx_tile\n", False),  # not the flags line
        ("", False),
    ],
)
def test_amx_is_read_from_the_flags_line_alone(tmp_path, flags, amx):
    from relaxtune.backends.sglang_cpu import cpu_has_amx

    (tmp_path / "cpuinfo").write_text(flags)
    assert cpu_has_amx(str(tmp_path / "cpuinfo")) is amx
    (tmp_path / "binary").write_bytes(b"flags\t: amx_tile \xff\xfe\n")
    assert cpu_has_amx(str(tmp_path / "binary")) is False  # not text: no crash


def test_launch_on_cpu_puts_the_stand_in_first_and_stops_every_process_of_the_group(fake_sglang):
    root = fake_sglang()
    port = _free_port()
    with launch([ServerSpec("some/model", port)], timeout=60, device="cpu") as urls:
        assert httpx.get(f"{urls[0]}/health").status_code == 200
        seen = json.loads((root / f"argv-{port}.json").read_text())
    assert seen["env"]["SGLANG_USE_CPU_ENGINE"] == "1" and "--disable-overlap-schedule" in seen["argv"]
    assert "sglang_cpu" in seen["env"]["PYTHONPATH"].split(":")[0]
    assert _gone(seen["child"])  # the server's child (as SGLang's scheduler) went with it


def test_a_server_that_dies_is_reported_with_its_last_log_lines(fake_sglang):
    fake_sglang(exit_code=3)
    with pytest.raises(
        RuntimeError,
        match=r"(?s)exited with code 3 before it was ready; its last log lines .*"
        r"the model folder has no config.json",
    ):
        with launch([ServerSpec("some/model", _free_port())], timeout=60, device="cpu"):
            pass


def test_a_server_that_never_becomes_ready_is_stopped_after_the_timeout(fake_sglang):
    root = fake_sglang(never_ready=True)
    port = _free_port()
    with pytest.raises(RuntimeError, match=rf"http://127.0.0.1:{port} did not become ready within 3 s"):
        with launch([ServerSpec("some/model", port)], timeout=3, device="cpu"):
            pass
    assert _gone(json.loads((root / f"argv-{port}.json").read_text())["child"])
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_a_port_already_taken_is_refused_before_starting(fake_sglang):
    import socket

    fake_sglang()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"port {port} is already in use"):
            with launch([ServerSpec("some/model", port)], timeout=30, device="cpu"):
                pass


def test_serve_refuses_native_threshold_on_a_cpu_host(fake_sglang):
    fake_sglang()
    out = CliRunner().invoke(
        app,
        ["serve", "--drafter", "d/m", "--verifier", "v/m", "--native-threshold", "0.5", "--device", "cpu"],
        env={"COLUMNS": "300"},
    )
    assert out.exit_code == 1
    assert (
        "cannot run on a CPU host" in out.output and "EAGLE is not supported in decode attention backend" in out.output
    )


@pytest.mark.slow  # about 6-11 s: the default run stays under 8 minutes on 2 cores
def test_serve_stops_its_servers_on_sigterm(fake_sglang):
    import os
    import signal
    import subprocess
    import time

    root = fake_sglang()
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relaxtune.cli",
            "serve",
            "--drafter",
            "d/m",
            "--verifier",
            "v/m",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
        start_new_session=True,
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "tune with" in line:
                break
        assert any("tune with" in x for x in lines), "".join(lines)
        children = [json.loads((root / f"argv-{p}.json").read_text())["child"] for p in (port, port + 1)]
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0 and "servers stopped" in rest
        deadline = time.monotonic() + 10
        while not all(_gone(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(_gone(c) for c in children)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
