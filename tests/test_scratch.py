"""Issue 38: an interrupt during the embedded model's conversion leaves no temporary folder (a real
SIGTERM to a converting process), and what a killed conversion left is swept at the next start."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from relaxtune.backends import embedded
from relaxtune.backends.embedded import EmbeddedModel, ensure_converted
from relaxtune.backends.scratch import scratch, sweep

ROOT = Path(__file__).resolve().parents[1]
TINY = EmbeddedModel("tiny", "x/tiny", "relaxtune-tinypart", 1, "1.0", 1, "0" * 64)

# the child converts a tiny model: the GGUF's assembly and loading are replaced by a tiny Qwen2 and its
# tokenizer; after the weights are written into the temporary folder it says so and waits to be signalled
CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import transformers
    from relaxtune.backends import embedded
    from tests.tiny_models import tiny_lm, tiny_tokenizer

    gguf = Path(sys.argv[1])
    embedded.assemble_gguf = lambda model: gguf
    tok = tiny_tokenizer()
    save = tok.save_pretrained

    def save_then_wait(path, **kw):
        save(path, **kw)
        print("WRITTEN", path, flush=True)
        time.sleep(float(sys.argv[2]))

    tok.save_pretrained = save_then_wait
    transformers.AutoTokenizer.from_pretrained = lambda *a, **k: tok
    transformers.AutoModelForCausalLM.from_pretrained = lambda *a, **k: tiny_lm()
    print("DONE", embedded.ensure_converted(embedded.EmbeddedModel("tiny", "x/tiny", "p", 1, "1.0", 1, "0")),
          flush=True)
""")


def _convert(tmp_path: Path, wait: float) -> subprocess.Popen:
    gguf = tmp_path / "cache" / "tiny" / "model.gguf"
    gguf.parent.mkdir(parents=True, exist_ok=True)
    gguf.write_bytes(b"GGUF")
    env = {**os.environ, "RELAXTUNE_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(gguf), str(wait)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _written(proc: subprocess.Popen) -> Path:
    line = proc.stdout.readline()
    assert line.startswith("WRITTEN"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return Path(line.split()[1])


def _leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache" / "tiny").iterdir() if p.name != "model.gguf")


def test_sigterm_during_conversion_leaves_no_temporary_folder(tmp_path):
    proc = _convert(tmp_path, wait=120)
    folder = _written(proc)
    assert folder.is_dir() and (folder / "model.safetensors").exists()  # the weights were on disk
    assert folder.name.startswith(f"hf-{proc.pid}-")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM  # it still ends as SIGTERM ends a process
    assert not folder.exists() and _leftovers(tmp_path) == []


def test_a_killed_conversion_is_swept_at_the_next_start(tmp_path, monkeypatch):
    proc = _convert(tmp_path, wait=120)
    folder = _written(proc)
    proc.kill()  # SIGKILL: nothing can clean up
    proc.wait(timeout=60)
    assert _leftovers(tmp_path) == [folder.name]

    import transformers

    from tests.tiny_models import tiny_lm, tiny_tokenizer

    monkeypatch.setenv("RELAXTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "assemble_gguf", lambda model: tmp_path / "cache" / "tiny" / "model.gguf")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tiny_tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny_lm())
    final = ensure_converted(TINY)
    assert final == tmp_path / "cache" / "tiny" / "hf" and (final / "config.json").exists()
    assert _leftovers(tmp_path) == ["hf"]  # the dead run's folder is gone, the new one renamed into place


def test_sweep_keeps_what_live_processes_write(tmp_path):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"hf-{live.pid}-abc").mkdir()
        (tmp_path / f"hf-{os.getpid()}-mine").mkdir()
        (tmp_path / "hf-legacy").mkdir()  # an earlier version's name: swept only once an hour old
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        (tmp_path / f"hf-{int(dead.stdout)}-dead").mkdir()
        old = tmp_path / "hf-old"
        old.mkdir()
        os.utime(old, (time.time() - 7200, time.time() - 7200))
        gone = sweep(tmp_path, "hf-")
        assert sorted(p.name for p in gone) == sorted([f"hf-{int(dead.stdout)}-dead", "hf-old"])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f"hf-{live.pid}-abc", f"hf-{os.getpid()}-mine", "hf-legacy"]
        )
    finally:
        live.kill()
        live.wait()


def test_an_exception_or_ctrl_c_removes_the_scratch_path(tmp_path):
    for error in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with scratch(tmp_path, "hf-") as folder:
                (folder / "weights").write_bytes(b"x" * 10)
                raise error
        assert list(tmp_path.iterdir()) == []
    with scratch(tmp_path, "model-", ".part", directory=False) as part:
        part.write_bytes(b"done")
        part.rename(tmp_path / "model.gguf")  # renamed away: kept
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]
