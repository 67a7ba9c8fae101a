"""Containment: a hostile solution reaches nothing outside its sandbox and its whole process
tree is bounded (issue 21). Each case runs a real solution through the real sandbox and
checks the host afterwards: no connection accepted, no signal delivered, no file left, no
process left, memory of the whole tree under the stated bound, and a time or memory
limit as the verdict where one should be. Solutions reach ``fork``, ``kill`` and
``system`` through ``posix`` (the official ``reliability_guard`` sets the ``os`` ones to
None; a hostile solution bypasses it the same way)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from relaxtune.graders.code import _job, grade_code
from relaxtune.graders.sandbox import run_job, sandbox_info

SUM = {"tests": [{"input": "1 2\n", "output": "3\n"}]}
ANSWER = "print(sum(map(int, input().split())))\n"
BOXED = sandbox_info().kind == "bubblewrap"
pytestmark = pytest.mark.skipif(not BOXED, reason=f"no bubblewrap here: {sandbox_info().note}")


def _fence(code: str) -> str:
    return f"```python\n{code}```"


def _processes_with(marker: str) -> list[str]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                found.append(entry)
        except OSError:
            pass
    return found


@pytest.fixture
def token():
    return str(secrets.randbelow(10**9) + 10**9)


@pytest.fixture
def open_dirs(token):
    """World-writable host directories under /run and /tmp (where a careless host leaves
    sockets), removed afterwards."""
    dirs = []
    for parent in ("/run", "/tmp"):
        if os.access(parent, os.W_OK):
            d = Path(parent) / f"relaxtune-containment-{token}"
            d.mkdir()
            d.chmod(0o1777)
            dirs.append(d)
    yield dirs
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


class _Listener:
    """A host listener that counts what reaches it (connections and bytes)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.accepted, self.data = sock, 0, b""
        sock.listen(8)
        sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.settimeout(1)
            try:
                self.data += conn.recv(1024)
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_host_unix_sockets_are_out_of_reach(open_dirs, token):
    listeners, paths = [], []
    for d in open_dirs:
        path = str(d / "host.sock")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        os.chmod(path, 0o777)
        listeners.append(_Listener(sock))
        paths.append(path)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0relaxtune-containment-{token}")
    listeners.append(_Listener(abstract))
    try:
        # the listeners work from the host
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(paths[0])
        probe.close()
        time.sleep(0.5)
        assert listeners[0].accepted == 1
        listeners[0].accepted = 0
        targets = paths + [f"\0relaxtune-containment-{token}"]
        code = (
            f"import socket\nfor path in {targets!r}:\n    try:\n        s = socket.socket(socket.AF_UNIX)\n"
            "        s.connect(path)\n        s.sendall(b'escaped')\n        print('reached', path)\n"
            "    except OSError:\n        pass\n" + ANSWER
        )
        verdict = grade_code(_fence(code), SUM, timeout=5)
        time.sleep(0.5)
    finally:
        for listener in listeners:
            listener.close()
    assert verdict.verdict == "pass", verdict.detail
    assert [listener.accepted for listener in listeners] == [0] * len(listeners)
    assert all(listener.data == b"" for listener in listeners)


def test_host_tcp_listener_is_out_of_reach():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    listener = _Listener(sock)
    try:
        code = (
            f"import socket\nfor host in ['127.0.0.1', 'localhost', '::1']:\n    try:\n"
            f"        s = socket.create_connection((host, {port}), timeout=2)\n        s.sendall(b'escaped')\n"
            "        print('reached', host)\n    except OSError:\n        pass\n" + ANSWER
        )
        verdict = grade_code(_fence(code), SUM, timeout=5)
        time.sleep(0.5)
    finally:
        listener.close()
    assert verdict.verdict == "pass", verdict.detail
    assert listener.accepted == 0 and listener.data == b""


def test_signals_reach_no_host_process(token):
    host = subprocess.Popen(["sleep", f"300.{token}"], start_new_session=True)
    try:
        code = (
            f"import posix, signal\nfor pid in [{host.pid}, -{host.pid}, -1, 1, {os.getpid()}]:\n"
            "    for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n        try:\n"
            "            posix.kill(pid, sig)\n        except OSError:\n            pass\n" + ANSWER
        )
        verdict = grade_code(_fence(code), SUM, timeout=5)
        time.sleep(0.3)
        state = Path(f"/proc/{host.pid}/stat").read_text().rpartition(")")[2].split()[0]
        assert host.poll() is None and state in ("S", "R"), state  # alive and not stopped
    finally:
        host.kill()
        host.wait()
    assert verdict.verdict == "pass", verdict.detail


def test_writes_never_reach_the_host(open_dirs, token):
    home = Path(os.path.expanduser("~"))
    targets = [str(d / f"escape-{token}") for d in open_dirs] + [
        f"/tmp/relaxtune-escape-{token}",
        f"/var/tmp/relaxtune-escape-{token}",
        f"/dev/shm/relaxtune-escape-{token}",
        str(home / f"relaxtune-escape-{token}"),
        f"{os.getcwd()}/relaxtune-escape-{token}",
        f"/usr/relaxtune-escape-{token}",
        f"/relaxtune-escape-{token}",
    ]
    code = (
        f"import posix\nfor path in {targets!r}:\n    try:\n        open(path, 'w').write('x')\n"
        "    except OSError:\n        pass\n"
        f"posix.system('touch {' '.join(targets)} 2>/dev/null')\n" + ANSWER
    )
    verdict = grade_code(_fence(code), SUM, timeout=5)
    assert verdict.verdict == "pass", verdict.detail
    assert [t for t in targets if os.path.exists(t)] == []


def _run(code: str, timeout: float):
    """The sandbox's outcome for ``code`` against SUM (its peak and bound included)."""
    job = _job(code, SUM, timeout, 1024)
    start = time.monotonic()
    outcome = run_job(job, backstop=60)
    return outcome, time.monotonic() - start


@pytest.mark.slow
def test_three_children_touching_600_mb_each_hit_the_tree_bound():
    code = (
        "import posix, time\nkids = []\nfor _ in range(3):\n    pid = posix.fork()\n    if pid == 0:\n"
        "        x = bytearray(600 << 20)\n        for i in range(0, len(x), 4096):\n            x[i] = 1\n"
        "        time.sleep(20)\n        posix._exit(0)\n    kids.append(pid)\n"
        "for pid in kids:\n    posix.waitpid(pid, 0)\n" + ANSWER
    )
    outcome, _ = _run(code, 20.0)
    bound = outcome.memory_bound
    assert bound is not None and bound < 3 * (600 << 20), "the stated bound must not hold three such children"
    if sandbox_info().cgroup:
        assert outcome.oom_kills >= 1
        assert outcome.peak_bytes is not None and outcome.peak_bytes <= bound
        verdict = grade_code(_fence(code), SUM, timeout=20)
        assert verdict.verdict == "memory", verdict.detail
    else:  # no control group: the process count times address space budget is the bound
        assert outcome.frame is not None


def test_spinning_unwaited_children_are_charged_to_the_test(token):
    code = (
        "import posix, time\nfor _ in range(6):\n    if posix.fork() == 0:\n        while True:\n"
        "            pass\n" + ANSWER + "time.sleep(60)\n"
    )
    start = time.monotonic()
    verdict = grade_code(_fence(code), SUM, timeout=1)
    assert verdict.verdict == "time_limit", verdict.detail
    assert time.monotonic() - start < 40


def test_a_fork_tree_is_bounded_and_leaves_nothing(token):
    code = (
        "import posix\ndef grow(depth):\n    for _ in range(4):\n        try:\n            pid = posix.fork()\n"
        "        except OSError:\n            return\n        if pid == 0:\n            posix.setsid()\n"
        "            if depth < 4:\n                grow(depth + 1)\n"
        f"            posix.execv('/bin/sleep', ['sleep', '90.{token}'])\n"
        "grow(0)\n" + ANSWER
    )
    verdict = grade_code(_fence(code), SUM, timeout=10)
    assert verdict.verdict == "pass", verdict.detail
    assert _processes_with(token) == []


def test_nothing_of_a_run_outlives_it(token):
    """A setsid()'d grandchild and a stopped child, alive when the verdict comes: gone after."""
    code = (
        "import posix, signal\nif posix.fork() == 0:\n    posix.setsid()\n    if posix.fork() == 0:\n"
        f"        posix.execv('/bin/sleep', ['sleep', '91.{token}'])\n    posix._exit(0)\n"
        f"if posix.fork() == 0:\n    posix.execv('/bin/sleep', ['sleep', '92.{token}'])\n" + ANSWER
    )
    verdict = grade_code(_fence(code), SUM, timeout=5)
    assert verdict.verdict == "pass", verdict.detail
    assert _processes_with(token) == []


def test_sandbox_states_its_containment():
    info = sandbox_info()
    line = info.describe()
    assert "bubblewrap" in line and ("control group" in line or "budget" in line)
    assert os.path.basename(info.bwrap) == "bwrap"


def test_without_a_control_group_the_process_budget_holds(monkeypatch):
    """Where no control group can be made, a test's processes are capped at the budget
    (RLIMIT_NPROC, counted in the sandbox's own user namespace) and the stated bound is
    that count times the address space per process."""
    import dataclasses

    from relaxtune.graders.sandbox import launcher

    info = dataclasses.replace(sandbox_info(), cgroup=False)
    monkeypatch.setattr(launcher, "sandbox_info", lambda: info)
    if os.geteuid() == 0 and not info.fresh_uid:
        pytest.skip("root's sandbox without a fresh uid: RLIMIT_NPROC does not bind uid 0")
    code = (
        "import posix, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = posix.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        posix._exit(0)\n"
        "    n += 1\nprint(n)\n"
    )
    outcome, _ = _run(code, 10.0)
    limit = launcher.budget(1 << 30)
    assert outcome.memory_bound == limit * (1 << 30) and outcome.oom_kills == 0
    assert outcome.frame["verdict"] == "wrong_answer"  # it printed how many forks succeeded, not the sum
    assert f"got '{limit - 2}'" in outcome.frame["detail"] or f"got '{limit - 1}'" in outcome.frame["detail"], (
        outcome.frame["detail"]
    )
