"""Load test of `dapo serve` (Ray Serve, HF engine, embedded tiny model) on loopback: bounded in count and time.

    python benchmarks/bench_serve.py --clients 64 --requests-per-client 4 --max-tokens 32

Starts the server on 127.0.0.1 (a free port), runs CLIENTS concurrent clients that each send REQUESTS chat requests
(temperature 1.0, top-p 0.7, max_tokens MAX_TOKENS) plus, with --malformed, one malformed body per client, and
reports requests/s, generated tokens/s (usage.completion_tokens) and p50/p99 latency of the well-formed requests.
Everything stops by itself after --time-limit seconds at the latest. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.serve.serve_helpers import ray_serve_app  # noqa: E402

QUESTION = "Solve: Tom has 3 apples and buys 4 more. How many apples does he have?"


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


async def load(base_url, clients, per_client, max_tokens, malformed, time_limit):
    body = {"model": "tiny-qwen2", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": max_tokens,
            "temperature": 1.0, "top_p": 0.7}
    latencies, tokens, failures, bad_status = [], [], [], []

    async def client(i, http):
        if malformed:
            r = await http.post(f"{base_url}/chat/completions", content=b"{broken",
                                headers={"content-type": "application/json"})
            bad_status.append(r.status_code)
        for _ in range(per_client):
            t0 = time.perf_counter()
            r = await http.post(f"{base_url}/chat/completions", json=body)
            if r.status_code != 200:
                failures.append(r.status_code)
                continue
            latencies.append(time.perf_counter() - t0)
            tokens.append(r.json()["usage"]["completion_tokens"])

    async with httpx.AsyncClient(timeout=time_limit, limits=httpx.Limits(max_connections=clients)) as http:
        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client(i, http) for i in range(clients))), time_limit)
        wall = time.perf_counter() - t0
    return {
        "clients": clients, "requests": len(latencies), "failed": len(failures),
        "malformed_sent": len(bad_status), "malformed_4xx": sum(400 <= s < 500 for s in bad_status),
        "wall_s": round(wall, 2), "requests_per_s": round(len(latencies) / wall, 2),
        "generated_tokens_per_s": round(sum(tokens) / wall, 1),
        "latency_p50_s": round(statistics.median(latencies), 3), "latency_p99_s": round(percentile(latencies, 99), 3),
        "mean_completion_tokens": round(sum(tokens) / max(len(tokens), 1), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--num-threads", type=int, default=2, help="torch threads in the replica")
    ap.add_argument("--malformed", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--time-limit", type=float, default=300.0)
    args = ap.parse_args()
    with ray_serve_app(num_threads=args.num_threads) as base_url:
        result = asyncio.run(load(base_url, args.clients, args.requests_per_client, args.max_tokens, args.malformed,
                                  args.time_limit))
        result["health_after"] = httpx.get(base_url.removesuffix("/v1") + "/health").status_code
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
