"""Where the test suite's CPU goes, per test file: the test's own CPU in its xdist worker plus every process it started.

    python scripts/profile_suite.py [PYTEST ARGS]          # default: -q -n 2 --dist loadfile (CI's command)
    python scripts/profile_suite.py tests/distributed -n 1  # one directory

The suite is CPU-bound on 2 cores (docs/results.md), so what shortens it is less CPU work, and wall times of tests
that run side by side do not say where that work is. This runs pytest with itself as a plugin (each test phase's
``time.process_time`` in its worker, with its start and end) while a thread polls ``/proc`` every 0.3 s for every
process's CPU time and parent. A process is charged to the test its xdist worker was running when the process first
appeared (through its parent chain: warm-server children, torchrun ranks and Ray workers included). Prints the files
by total CPU; writes the raw data (phases.jsonl, processes.json) to $PROFILE_SUITE_OUT (default /tmp/suite-profile).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HZ = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------- the pytest plugin
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _measure(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _measure(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _measure(item, "teardown")


def _measure(item, phase: str):
    t0, c0 = time.time(), time.process_time()
    yield
    with open(os.environ["PROFILE_SUITE_PHASES"], "a") as f:
        f.write(
            json.dumps(
                {
                    "worker_pid": os.getpid(),
                    "id": item.nodeid,
                    "phase": phase,
                    "t0": t0,
                    "wall": time.time() - t0,
                    "cpu": time.process_time() - c0,
                }
            )
            + "\n"
        )


# ------------------------------------------------------------------------------------------------- the /proc poller
def _poll(seen: dict, stop: threading.Event) -> None:
    first_pass = True
    while not stop.is_set():
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                rest = stat[stat.rindex(")") + 2 :].split()
                cpu, key = (int(rest[11]) + int(rest[12])) / HZ, f"{d}:{rest[19]}"  # utime + stime; pid:starttime
                if key not in seen:
                    cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    seen[key] = {
                        "pid": int(d),
                        "ppid": int(rest[1]),
                        "cmd": cmd[:200],
                        "first": time.time(),
                        "cpu0": cpu if first_pass else 0.0,
                    }
                seen[key]["cpu"] = cpu
            except (OSError, ValueError, IndexError):
                pass  # the process ended between listing and reading
        first_pass = False
        stop.wait(0.3)


def charge(procs: list[dict], phases: list[dict]) -> tuple[dict, dict]:
    """(in-worker CPU per file, child-process CPU per file): each process charged to the test phase its worker ran
    when the process first appeared."""
    by_pid = {p["pid"]: p for p in procs}
    workers = {r["worker_pid"] for r in phases}
    spans = collections.defaultdict(list)
    inproc = collections.Counter()
    for r in phases:
        spans[r["worker_pid"]].append(r)
        inproc[r["id"].split("::")[0]] += r["cpu"]

    def worker_of(pid: int) -> int | None:
        for _ in range(30):
            if pid in workers:
                return pid
            if pid not in by_pid:
                return None
            pid = by_pid[pid]["ppid"]
        return None

    child = collections.Counter()
    for p in procs:
        w = worker_of(p["ppid"]) if p["pid"] not in workers else None
        if w is None:
            continue
        test = next((r["id"] for r in spans[w] if r["t0"] - 0.5 <= p["first"] <= r["t0"] + r["wall"] + 0.5), "?")
        child[test.split("::")[0]] += p["cpu"] - p["cpu0"]
    return inproc, child


def main() -> int:
    args = sys.argv[1:] or ["-q", "-n", "2", "--dist", "loadfile"]
    out = Path(os.environ.get("PROFILE_SUITE_OUT", "/tmp/suite-profile"))
    out.mkdir(parents=True, exist_ok=True)
    phases_file = out / "phases.jsonl"
    phases_file.unlink(missing_ok=True)
    seen: dict = {}
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(seen, stop), daemon=True)
    poller.start()
    env = {
        **os.environ,
        "PROFILE_SUITE_PHASES": str(phases_file),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "scripts"), os.environ.get("PYTHONPATH")])),
    }
    t0 = time.monotonic()
    code = subprocess.call(
        [sys.executable, "-m", "pytest", "-p", "profile_suite", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env
    )
    wall = time.monotonic() - t0
    stop.set()
    poller.join()
    procs = list(seen.values())
    (out / "processes.json").write_text(json.dumps(procs))
    phases = [json.loads(line) for line in phases_file.read_text().splitlines()] if phases_file.exists() else []
    inproc, child = charge(procs, phases)
    total = {f: inproc[f] + child[f] for f in set(inproc) | set(child)}
    print(
        f"\npytest exit code {code}, wall {wall:.0f} s; CPU charged to tests: in workers {sum(inproc.values()):.0f} s, "
        f"in processes they started {sum(child.values()):.0f} s"
    )
    print(f"{'total':>7} {'worker':>7} {'started':>8}  file (CPU seconds)")
    for f in sorted(total, key=total.get, reverse=True)[:40]:
        print(f"{total[f]:7.1f} {inproc[f]:7.1f} {child[f]:8.1f}  {f}")
    return code


if __name__ == "__main__":
    sys.exit(main())
