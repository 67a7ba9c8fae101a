"""Peak memory of a command's whole process tree, as its cgroup's peak.

Usage (as root, or with a delegated cgroup)::

    python scripts/peak_memory.py [--evict FILE ...] -- relaxtune tune --task humaneval ...

The command runs in a fresh memory cgroup: cgroup v2 (``memory.peak``) where the
unified hierarchy has the memory controller, else cgroup v1
(``memory.max_usage_in_bytes``). A cgroup charges every page its processes bring
in, anonymous memory and page cache alike (the mmap'd GGUF files included, unless
another cgroup read them first: ``--evict`` drops the named files' clean pages
from the page cache before the run, ``posix_fadvise(DONTNEED)``, so the run
reads them anew and is charged for them). Every 0.5 s the script also samples
the cgroup's ``memory.stat`` and the tree's summed resident set (``VmRSS`` of each
process) and prints their peaks: the anonymous part (``anon`` / ``rss``) is what
the processes allocated, the rest is page cache.

Prints one JSON line on stderr at the end; exits with the command's exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/memory")


def make_cgroup(name: str) -> tuple[Path, str]:
    """A fresh memory cgroup and the file holding its peak (bytes)."""
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        path = V2 / name
        path.mkdir()
        return path, "memory.peak"
    if (V1 / "memory.max_usage_in_bytes").exists():
        path = V1 / name
        path.mkdir()
        return path, "memory.max_usage_in_bytes"
    raise SystemExit("no writable memory cgroup (v2 with the memory controller, or v1) on this machine")


def tree_rss(root: int) -> int:
    """Summed ``VmRSS`` (bytes) of ``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid, ppid = int(entry), int(fields.get("PPid", "0"))
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evict", nargs="*", default=[], help="files to drop from the page cache first")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    for name in args.evict:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    cgroup, peak_file = make_cgroup(f"peak-{os.getpid()}-{int(time.time())}")
    procs = str(cgroup / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    proc = subprocess.Popen(command, preexec_fn=enter)
    peaks = {"tree_rss": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            try:
                stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
            except OSError:
                continue
            for key in ("anon", "rss", "file", "cache", "mapped_file", "file_mapped"):
                if key in stat:
                    peaks[key] = max(peaks.get(key, 0), int(stat[key]))
            peaks["tree_rss"] = max(peaks["tree_rss"], tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    done.set()
    sampler.join()
    peak = int((cgroup / peak_file).read_text())
    report = {"cgroup": str(cgroup), "peak_bytes": peak, "peak_gb": round(peak / 1e9, 3)}
    report |= {f"sampled_peak_{k}_gb": round(v / 1e9, 3) for k, v in peaks.items()}
    print(json.dumps(report), file=sys.stderr)
    try:
        cgroup.rmdir()
    except OSError:
        pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
