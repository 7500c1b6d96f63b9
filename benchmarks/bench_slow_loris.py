"""How fast `dapo serve` answers a normal client while a slow-loris attacker holds hundreds of stalled uploads.

    python benchmarks/bench_slow_loris.py --stalled 320 --seconds 10 --out runs/bench-slow-loris.json

Starts `dapo serve` (embedded tiny model, HF backend, loopback; bench_serve.start_target) with a short body timeout, then measures a normal
client (GET /v1/models then a 2-token chat request, one pair every 0.2 s; the latency is the pair's) in three phases:
  quiet       no attacker;
  burst       N connections open at once, each sending headers and part of a 4000-byte body, then stalling;
  persistent  the attacker keeps N stalled uploads open, opening a new one whenever the server closes one.
plus quiet-direct: the quiet client straight to Ray Serve's proxy behind dapo serve's front door (its loopback port,
from the start-up line), so that quiet-direct vs quiet is the front door's own cost.
Reports p50/p90/max latency per phase, the statuses the stalled uploads were answered with, and failed normal
requests (a failure counts; it is never retried). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import socket
import time
from pathlib import Path

import httpx
from bench_serve import ROOT, free_port, percentile, start_target, stop_target, wait_ready

HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b'Content-Length: 4000\r\n\r\n{"model": "tiny-qwen2", '
)


def attack(port: int, n: int, persistent, stop, results) -> None:
    """The attacker, in a process of its own (sharing the client's GIL would slow the client, not the server): opens
    ``n`` stalled uploads at once, and once ``persistent`` is set replaces every one the server answers or closes."""
    open_: list[socket.socket] = []
    statuses: dict[str, int] = {}

    def connect() -> None:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(HEAD)
        s.setblocking(False)
        open_.append(s)

    def reap() -> None:
        alive = []
        for s in open_:
            try:
                data = s.recv(200)
            except BlockingIOError:
                alive.append(s)
                continue
            except OSError:
                data = b""
            parts = data.split(b"\r\n", 1)[0].decode(errors="replace").split(" ") if data else []
            status = parts[1] if len(parts) > 1 else "closed"
            statuses[status] = statuses.get(status, 0) + 1
            s.close()
        open_[:] = alive

    for _ in range(n):
        connect()
    while not stop.is_set():
        reap()
        while persistent.is_set() and len(open_) < n:
            connect()
        time.sleep(0.05)
    reap()
    for s in open_:
        s.close()
    results.put(statuses)


def normal_client(url: str, seconds: float) -> tuple[list[float], list[str]]:
    latencies, failures = [], []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as http:
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                r = http.get(f"{url}/v1/models")
                if r.status_code == 200:
                    r = http.post(
                        f"{url}/v1/chat/completions",
                        json={
                            "model": "tiny-qwen2",
                            "messages": [{"role": "user", "content": "1 + 1 ="}],
                            "max_tokens": 2,
                            "temperature": 0,
                        },
                    )
                failure = None if r.status_code == 200 else f"{r.request.url.path} {r.status_code} {r.text[:200]}"
            except httpx.HTTPError as e:
                failure = f"{type(e).__name__}: {e}"
            if failure is None:
                latencies.append(time.monotonic() - t0)
            else:
                failures.append(failure)
            time.sleep(0.2)
    return latencies, failures


def summary(latencies: list[float], failures: list[str]) -> dict:
    return {
        "requests": len(latencies),
        "failed": len(failures),
        "failures": failures[:5],
        "p50_s": percentile(latencies, 50),
        "p90_s": percentile(latencies, 90),
        "max_s": max(latencies) if latencies else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stalled", type=int, default=320)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each measured phase")
    ap.add_argument("--body-timeout", type=float, default=3.0)
    ap.add_argument("--max-unfinished-uploads", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import sys

    from dapo.infra.perf import cpu_name

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc, _ = start_target(
        "dapo-hf",
        str(ROOT / "src" / "dapo" / "assets" / "tiny-qwen2"),
        port,
        threads=1,
        dapo_args=(
            "--body-timeout",
            str(args.body_timeout),
            "--max-unfinished-uploads",
            str(args.max_unfinished_uploads),
        ),
    )
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "host_cpu": cpu_name(),
        "command": " ".join(["python", "benchmarks/bench_slow_loris.py", *sys.argv[1:]]),
        "stalled": args.stalled,
        "body_timeout_s": args.body_timeout,
        "max_unfinished_uploads": args.max_unfinished_uploads,
        "phases": {},
    }
    try:
        wait_ready(proc, url, 240)
        normal_client(url, 1.0)  # warm-up: the first chat request builds the model's caches
        behind = re.search(r"proxy behind it: (127\.0\.0\.1:\d+)", Path(proc.log_path).read_text(errors="replace"))
        if behind:
            results["phases"]["quiet-direct"] = summary(*normal_client(f"http://{behind.group(1)}", args.seconds))
        results["phases"]["quiet"] = summary(*normal_client(url, args.seconds))
        ctx = multiprocessing.get_context("spawn")
        persistent, stop, answers = ctx.Event(), ctx.Event(), ctx.Queue()
        attacker = ctx.Process(target=attack, args=(port, args.stalled, persistent, stop, answers))
        attacker.start()
        time.sleep(0.5)  # most of the burst is out before the client's first request
        results["phases"]["burst"] = summary(*normal_client(url, args.seconds))
        persistent.set()
        results["phases"]["persistent"] = summary(*normal_client(url, args.seconds))
        stop.set()
        results["stalled_upload_answers"] = answers.get(timeout=60)
        attacker.join(30)
    finally:
        stop_target(proc)
    print("| phase | normal requests | failed | p50 | p90 | max |\n|---|---|---|---|---|---|")
    for phase, r in results["phases"].items():
        print(
            f"| {phase} | {r['requests']} | {r['failed']} | {r['p50_s']:.3f} s | {r['p90_s']:.3f} s | "
            f"{r['max_s']:.3f} s |"
        )
    print("stalled uploads were answered:", results["stalled_upload_answers"])
    for phase, r in results["phases"].items():
        for failure in r["failures"]:
            print(f"{phase}: failed: {failure}")
    if args.out:
        from dapo.infra.atomic import atomic_write

        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out, json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
