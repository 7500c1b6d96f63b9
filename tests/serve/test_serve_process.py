"""`dapo serve` as a user runs it: a real process on loopback (embedded tiny model, Ray Serve), driven by the official
openai client and by `dapo eval --base-url`; its Ray services' sockets; a bounded concurrent load with malformed
requests mixed in; and a bounded fault suite (slow-loris uploads and unfinished headers, which its front door holds;
oversized fan-out, deep JSON, lone surrogates, disconnects) during which a normal request keeps being answered within
a second. Loopback only.

One server for the whole module (Ray Serve takes ~30-45 s to come up on 2 cores): the client-facing tests run first,
the fault suite last (pytest keeps file order)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ray[serve]')")
openai = pytest.importorskip("openai", reason="the openai client is not installed")
psutil = pytest.importorskip("psutil", reason="psutil is not installed")
import httpx  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from dapo.cli.main import cli  # noqa: E402
from tests.harness.ports import free_port  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
BODY_TIMEOUT_S = 3.0
HEADER_TIMEOUT_S = 2.0
UPLOAD_CAP = 64  # dapo serve's default: the concurrent load below sends 64 bodies at once, which must not be evicted
MODEL = "tiny-qwen2"
QUESTION = "Solve: Tom has 3 apples and buys 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    # Its log goes to a file, not a pipe nobody reads: Ray forwards every replica log line to the driver's stderr, and
    # once a pipe's 64 KiB filled, a write there would block the process that also runs the front door.
    log_path = tmp_path_factory.mktemp("dapo-serve") / "stderr.log"
    log = open(log_path, "w")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dapo.cli.main",
            "serve",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--num-threads",
            "1",
            "--max-sequences-per-request",
            "64",
            "--body-timeout",
            str(BODY_TIMEOUT_S),
            "--header-timeout",
            str(HEADER_TIMEOUT_S),
            "--max-unfinished-uploads",
            str(UPLOAD_CAP),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    proc.log_path = log_path  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dapo serve exited with {proc.returncode}: {log_path.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("dapo serve did not answer /health within 180 s")
            time.sleep(0.5)
        yield proc, url
    finally:
        # dapo serve and its Ray processes (its own session). Its graceful stop (ray.shutdown) does not finish once
        # Ray's own processes got the signal too (it was waited for 10 s to no avail): they are killed after 2 s.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def base_url(server):
    return server[1] + "/v1"


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=120)


def _chat(url, **extra):
    body = {
        "model": "tiny-qwen2",
        "messages": [{"role": "user", "content": "3 + 4 ="}],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def test_health_models_and_chat_answer_200(server):
    _, url = server
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == ["tiny-qwen2"]
    r = client.chat.completions.create(
        model="tiny-qwen2", messages=[{"role": "user", "content": "3 + 4 ="}], max_tokens=4, temperature=0
    )
    assert r.choices[0].message.content is not None and r.usage.completion_tokens >= 1


def test_ray_services_listen_on_loopback_only(server):
    proc, _ = server
    root = psutil.Process(proc.pid)
    pids = {root.pid} | {p.pid for p in root.children(recursive=True)}
    listening = [
        (c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name())
        for c in psutil.net_connections("inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]
    assert len(listening) >= 5  # GCS, raylet, agents, controller, proxy, replica: all found
    exposed = [entry for entry in listening if entry[0] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_models_and_health(client, base_url):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(base_url.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and health["backend"] == "hf"


def test_chat_completion_greedy_is_deterministic_and_counts_usage(client):
    kw = dict(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, seed=1, max_completion_tokens=32
    )
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].finish_reason in ("stop", "length")
    assert a.usage.completion_tokens >= 1 and a.usage.prompt_tokens > 10
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens


def test_chat_n_samples_seeded_and_logprobs(client):
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=1.0,
        seed=7,
        n=3,
        max_tokens=24,
        logprobs=True,
    )
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert len(a.choices) == 3 and [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert all(lp.logprob <= 0 for c in a.choices for lp in c.logprobs.content)
    assert a.usage.completion_tokens == sum(len(c.logprobs.content) for c in a.choices)


def test_completions_with_stop_and_logprobs(client):
    r = client.completions.create(
        model=MODEL, prompt=["3 + 4 =", "10 - 2 ="], max_tokens=16, temperature=0, stop=["\n"], logprobs=1
    )
    assert len(r.choices) == 2
    for c in r.choices:
        assert "\n" not in c.text
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs)


def test_streaming_chat_matches_the_non_streamed_answer(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=32)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole and finish in ("stop", "length") and usage.completion_tokens >= 1


def test_errors_are_openai_style_4xx(client, base_url):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10**6)
    r = httpx.post(f"{base_url}/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_served_eval_equals_local_eval_at_temperature_0(base_url, tmp_path):
    common = [
        "eval",
        "--test-file",
        "synth",
        "--max-problems",
        "6",
        "--n",
        "2",
        "--temperature",
        "0",
        "--max-tokens",
        "32",
        "--seed",
        "5",
        "--quiet",
    ]
    runner = CliRunner()
    local = runner.invoke(cli, common + ["--output", str(tmp_path / "local.jsonl")])
    assert local.exit_code == 0, local.output
    served = runner.invoke(
        cli,
        common
        + ["--output", str(tmp_path / "served.jsonl"), "--base-url", base_url, "--model", MODEL, "--concurrency", "8"],
    )
    assert served.exit_code == 0, served.output
    a = json.loads((tmp_path / "local.summary.json").read_text())["metrics"]
    b = json.loads((tmp_path / "served.summary.json").read_text())["metrics"]
    assert a == b

    def responses(name):
        rows = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        return sorted((r["problem_key"], r["sample_index"], r["response"], r["response_tokens"]) for r in rows)

    assert responses("local.jsonl") == responses("served.jsonl")


def test_concurrent_load_with_malformed_requests(base_url):
    """64 concurrent clients x 2 requests each; every 8th client sends malformed bodies. Bounded: 128 requests."""
    good = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8, "temperature": 1.0}
    bad_bodies = [
        b"{",
        json.dumps({"model": MODEL, "messages": "x"}).encode(),
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": "2"}).encode(),
        json.dumps({"model": "other", "messages": [{"role": "user", "content": "x"}]}).encode(),
    ]

    async def one_client(i, http):
        statuses = []
        for j in range(2):
            if i % 8 == 7:
                body = bad_bodies[(i + j) % len(bad_bodies)]
                r = await http.post(
                    f"{base_url}/chat/completions", content=body, headers={"content-type": "application/json"}
                )
                statuses.append(("bad", r.status_code, r.json()["error"]["message"]))
            else:
                r = await http.post(f"{base_url}/chat/completions", json=good)
                answer = r.json()
                assert "choices" in answer, (r.status_code, answer)  # which refusal, if a normal request got one
                statuses.append(("good", r.status_code, answer["choices"][0]["finish_reason"]))
        return statuses

    async def main():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            return await asyncio.wait_for(asyncio.gather(*(one_client(i, http) for i in range(64))), 150)

    results = [s for client_results in asyncio.run(main()) for s in client_results]
    assert len(results) == 128
    assert all(code == 200 for kind, code, _ in results if kind == "good")
    assert all(400 <= code < 500 for kind, code, _ in results if kind == "bad")
    assert httpx.get(base_url.removesuffix("/v1") + "/health").status_code == 200


def _normal_request_latencies(url, seconds: float, at_least: int = 1) -> list[float]:
    """A normal client for ``seconds`` and ``at_least`` requests: GET /v1/models then a 2-token chat, every 0.2 s;
    each pair's latency. The client waits 30 s, so a slow answer is measured rather than raised."""
    latencies = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as http:
        while time.monotonic() < end or len(latencies) < at_least:
            t0 = time.monotonic()
            r = http.get(f"{url}/v1/models")
            assert r.status_code == 200
            r = http.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": "tiny-qwen2",
                    "messages": [{"role": "user", "content": "1 + 1 ="}],
                    "max_tokens": 2,
                    "temperature": 0,
                },
            )
            assert r.status_code == 200, r.text
            latencies.append(time.monotonic() - t0)
            time.sleep(0.2)
    return latencies


def _answer_and_close(sock: socket.socket, wait_s: float) -> bytes:
    """The status line the server answered ``sock`` with, once it has also closed it (b"still open: ..." if it did
    not within ``wait_s``)."""
    sock.settimeout(wait_s)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except socket.timeout:
        return b"still open: " + data[:80]
    except OSError as e:
        return repr(e).encode()
    return data.split(b"\r\n", 1)[0]


def test_slow_loris_uploads_do_not_stop_the_server(server):
    """320 connections send headers and part of a body, then stall: dapo serve's front door holds them, and Ray's
    proxy never sees them. A normal client keeps being answered within a second; the stalled uploads are answered
    503 (beyond the cap) or 408 (after the body timeout) and closed."""
    _, url = server
    port = int(url.rsplit(":", 1)[1])
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 4000\r\n\r\n{"model": "tiny-qwen2", '
    )
    assert _chat(url).status_code == 200  # the model is warm: what is measured below is the server under attack
    stalled = []
    try:
        for _ in range(320):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head)
            stalled.append(s)
        latencies = sorted(_normal_request_latencies(url, BODY_TIMEOUT_S + 1.5, at_least=5))
        # The median is the requirement (typical answers take 0.03-0.3 s, docs/serving.md); the max is a liveness
        # bound for a shared 2-core CI machine where another dapo serve may be starting (before the front door, the
        # first request waited 2.5 s behind Ray's proxy dispatching the 320 connections, and in CI one timed out).
        assert latencies[len(latencies) // 2] < 1.0 and latencies[-1] < 15.0, latencies
        answers = [_answer_and_close(s, BODY_TIMEOUT_S + 10) for s in stalled]
        statuses = sorted({a.decode(errors="replace") for a in answers})
        assert all(b" 503 " in a or b" 408 " in a for a in answers), statuses
        assert sum(b" 408 " in a for a in answers) <= UPLOAD_CAP
    finally:
        for s in stalled:
            s.close()


def test_headers_that_never_finish_are_answered_408_and_closed(server):
    """Ray's proxy has no header timeout (a request whose headers never finish kept its connection for good); the
    front door answers it 408 and closes it, and a connection that sends nothing is closed."""
    _, url = server
    port = int(url.rsplit(":", 1)[1])
    partial = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(50)]
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        for s in partial:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applica")
        assert _chat(url).status_code == 200
        answers = [_answer_and_close(s, HEADER_TIMEOUT_S + 15) for s in partial]
        assert all(b" 408 " in a for a in answers), sorted(set(answers))
        assert _answer_and_close(silent, 15) == b""
    finally:
        for s in [*partial, silent]:
            s.close()


def test_oversized_fan_out_deep_json_and_surrogates_are_400_and_harmless(server):
    _, url = server
    r = httpx.post(
        f"{url}/v1/completions", json={"model": "tiny-qwen2", "prompt": ["1+1="] * 1000, "n": 64}, timeout=10
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_sequences"
    deep = b'{"model": "tiny-qwen2", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{url}/v1/chat/completions", content=deep, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    raw = b'{"model": "tiny-qwen2", "messages": [{"role": "user", "content": "a \\ud800 b"}]}'
    r = httpx.post(f"{url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=10)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "messages[0].content" and "lone surrogate" in error["message"]
    assert "Error" not in error["message"] and "tokenizer" not in error["message"].lower()
    assert _chat(url).status_code == 200


def test_clients_that_disconnect_leave_the_server_answering(server):
    """Long answers (the tiny model continues "The" greedily without an end) whose clients hang up: the server drops
    them and keeps answering."""
    _, url = server
    long = {"model": "tiny-qwen2", "prompt": "The", "max_tokens": 400, "temperature": 0}
    body = json.dumps({**long, "stream": True}).encode()
    port = int(url.rsplit(":", 1)[1])
    for _ in range(8):  # send a streamed request, read its first bytes, hang up
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            assert s.recv(64).startswith(b"HTTP/1.1 200")
    for _ in range(4):  # and non-streamed ones that time out on the client's side
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{url}/v1/completions", timeout=0.3, json=long)
    latencies = _normal_request_latencies(url, 1.0)
    assert latencies and max(latencies) < 5.0
    deadline = time.monotonic() + 30
    while (health := httpx.get(f"{url}/health", timeout=10).json())["active_requests"]:
        assert time.monotonic() < deadline, f"abandoned requests are still decoding: {health}"
        time.sleep(0.2)


def test_the_front_door_logged_no_failure(server):
    """Last: nothing above (malformed requests, slow-loris uploads, hang-ups) made a connection fail unexpectedly in
    the front door, which logs every such failure with its traceback."""
    proc, _ = server
    log = proc.log_path.read_text(errors="replace")
    assert "front door: connection failed" not in log, log[log.find("front door: connection failed") :][:3000]
