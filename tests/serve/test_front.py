"""dapo serve's front door (dapo.serve.front) alone, on loopback with real sockets and no Ray: in front of a stub
upstream (a Starlette app under uvicorn standing in for Ray Serve's proxy) that records what reached it and holds its
slow answers until the test opens a gate. Every check waits for an event with a liveness bound; none times the
server."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("h11")
pytest.importorskip("uvicorn", reason="uvicorn is not installed")

from dapo.serve.config import ServeConfig  # noqa: E402
from tests.harness.ports import free_port  # noqa: E402
from tests.serve.serve_helpers import asgi_server, front_door, sends_nothing  # noqa: E402

LIVENESS_S = 10.0  # how long any expected event may take on a loaded machine; none takes more than ~1 s on an idle one
GATE_OPENS_BY_ITSELF_S = 20.0  # so that a broken front fails its test instead of hanging it


class Upstream:
    """A stub of Ray Serve's proxy: echoes chat bodies, and holds /stream (after its first event) and /slow until
    ``gate`` opens; ``ended`` is set when either handler stops, ``completed`` says whether it ran to the end."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.reset()

    def reset(self) -> None:
        self.bodies.clear()
        self.gate, self.started, self.ended = threading.Event(), threading.Event(), threading.Event()
        self.completed = False

    async def _held(self, request) -> bool:
        """Wait for the gate; False when the client (the front) hung up first."""
        deadline = time.monotonic() + GATE_OPENS_BY_ITSELF_S
        while not self.gate.is_set() and time.monotonic() < deadline:
            if await request.is_disconnected():
                return False
            await asyncio.sleep(0.01)
        self.gate.set()  # opened by itself: the tests that check it was still shut then fail
        return True

    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        async def models(request):
            return JSONResponse({"object": "list", "data": [{"id": "stub"}]})

        async def chat(request):
            body = await request.body()
            self.bodies.append(body)
            return Response(body, media_type="application/json")

        async def stream(request):
            async def events():
                self.started.set()
                try:
                    yield b"data: first\n\n"
                    # Polling for the disconnect itself: whether Starlette cancels a stream on a disconnect depends on
                    # its version and the server's ASGI spec version.
                    if await self._held(request):
                        yield b"data: last\n\n"
                        self.completed = True
                finally:
                    self.ended.set()

            return StreamingResponse(events(), media_type="text/event-stream")

        async def slow(request):
            await request.body()
            self.started.set()
            try:
                self.completed = await self._held(request)
            finally:
                self.ended.set()
            return JSONResponse({"done": True})

        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/stream", stream),
                Route("/slow", slow, methods=["POST"]),
            ]
        )


@pytest.fixture(scope="module")
def stub():
    upstream = Upstream()
    with asgi_server(upstream.app()) as port:
        yield upstream, f"http://127.0.0.1:{port}"


def _front(stub, **bounds):
    upstream, url = stub
    upstream.reset()
    return front_door(ServeConfig(device="cpu", **bounds), url)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=LIVENESS_S)


def _post(path: str, body: bytes, length: int | None = None, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n{extra}\r\n"
    ).encode() + body


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length body, read off ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole response: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _closed(sock: socket.socket) -> bool:
    """True once the server closes ``sock`` (within the liveness bound)."""
    sock.settimeout(LIVENESS_S)
    try:
        while sock.recv(65536):
            pass
    except socket.timeout:
        return False
    except ConnectionError:
        pass
    return True


def _error(status_and_body) -> tuple[int, str]:
    status, _, body = status_and_body
    return status, json.loads(body)["error"]["code"]


def test_requests_pass_through_on_one_kept_alive_connection_until_it_idles(stub):
    upstream, _ = stub
    body = json.dumps({"model": "stub", "messages": [{"role": "user", "content": "1 + 1 ="}]}).encode()
    with _front(stub, keep_alive_timeout_s=0.5) as port, _connect(port) as s:
        s.sendall(_post("/v1/chat/completions", body))
        status, headers, echoed = _response(s)
        assert status == 200 and echoed == body and upstream.bodies == [body]
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, listing = _response(s)
        assert status == 200 and json.loads(listing)["data"] == [{"id": "stub"}]
        assert _closed(s)  # idle past the keep-alive timeout


def test_headers_not_whole_within_the_header_timeout_get_408_and_the_connection_closes(stub):
    upstream, _ = stub
    with _front(stub, header_timeout_s=0.5) as port, _connect(port) as partial, _connect(port) as silent:
        partial.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        assert _error(_response(partial)) == (408, "request_timeout")
        assert _closed(partial)
        assert _closed(silent)  # sent nothing: closed without an answer
    assert not upstream.started.is_set() and not upstream.bodies


def test_a_body_not_whole_within_the_body_timeout_gets_408_and_never_reaches_upstream(stub):
    upstream, _ = stub
    with _front(stub, body_timeout_s=1.0, body_grace_s=0.2) as port, _connect(port) as s:
        s.sendall(_post("/v1/chat/completions", b'{"model": ', length=100))
        assert _error(_response(s)) == (408, "request_timeout")
        assert _closed(s)
    assert not upstream.bodies


def test_one_upload_too_many_drops_the_oldest_with_503_and_the_newcomer_is_answered(stub):
    upstream, _ = stub
    body = b'{"model": "stub"}'
    with _front(stub, max_unfinished_uploads=2, body_timeout_s=30, body_grace_s=0.2) as port:
        stalled = []
        try:
            for _ in range(2):
                stalled.append(_connect(port))
                stalled[-1].sendall(_post("/v1/chat/completions", b'{"model": ', length=100))
                time.sleep(0.4)  # past its grace: it holds a slot, the older first
            late = _connect(port)
            stalled.append(late)
            late.sendall(_post("/v1/chat/completions", b"", length=len(body)))
            assert _error(_response(stalled[0])) == (503, "too_many_uploads")  # long before its 30 s body timeout
            assert _closed(stalled[0])
            assert sends_nothing(stalled[1])  # the younger stalled upload keeps its slot
            late.sendall(body)
            status, _, echoed = _response(late)
            assert status == 200 and upstream.bodies == [body]
        finally:
            for s in stalled:
                s.close()


def test_bodies_over_the_limit_get_413_declared_or_chunked(stub):
    upstream, _ = stub
    with _front(stub, max_body_bytes=1000) as port:
        with _connect(port) as s:  # refused on its Content-Length, before a byte of the body
            s.sendall(_post("/v1/chat/completions", b"", length=5000))
            assert _error(_response(s)) == (413, "request_too_large")
        with _connect(port) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"%x\r\n%s\r\n" % (800, b"a" * 800)
                + b"%x\r\n%s\r\n" % (800, b"b" * 800)
            )
            assert _error(_response(s)) == (413, "request_too_large")
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=b"x" * 100_000, timeout=LIVENESS_S)
        assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
    assert not upstream.bodies


def test_expect_100_continue_is_answered_before_the_body(stub):
    body = b'{"model": "stub"}'
    with _front(stub) as port, _connect(port) as s:
        s.sendall(_post("/v1/chat/completions", b"", length=len(body), extra="Expect: 100-continue\r\n"))
        assert s.recv(200).startswith(b"HTTP/1.1 100 ")
        s.sendall(body)
        assert _response(s)[2] == body


def test_a_stream_passes_through_event_by_event(stub):
    upstream, _ = stub
    with _front(stub) as port, httpx.stream("GET", f"http://127.0.0.1:{port}/stream", timeout=30) as r:
        chunks = r.iter_raw()
        first = next(chunks)
        assert not upstream.gate.is_set(), "the first event arrived only once the upstream finished"
        upstream.gate.set()
        rest = b"".join(chunks)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert first + rest == b"data: first\n\ndata: last\n\n" and upstream.completed


def test_a_client_that_hangs_up_closes_its_upstream_request(stub):
    upstream, _ = stub
    with _front(stub) as port:
        with _connect(port) as s:  # mid-stream
            s.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.1 200")
        assert upstream.ended.wait(LIVENESS_S) and not upstream.completed and not upstream.gate.is_set()
        upstream.reset()
        with _connect(port) as s:  # waiting for a non-streamed answer (nothing to write: only the socket's EOF says)
            s.sendall(_post("/slow", b"{}"))
            assert upstream.started.wait(LIVENESS_S)
        assert upstream.ended.wait(LIVENESS_S) and not upstream.completed and not upstream.gate.is_set()


def test_an_upstream_that_does_not_answer_is_a_502_in_the_openai_format(stub):
    with front_door(ServeConfig(device="cpu"), f"http://127.0.0.1:{free_port()}") as port:
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=LIVENESS_S)
    assert r.status_code == 502 and r.json()["error"]["code"] == "bad_gateway"


def test_a_close_drains_the_request_in_flight_and_refuses_new_ones(stub):
    # Before: SIGTERM cut every in-flight request at once (24 of 24 streams ended with neither [DONE] nor an error).
    import asyncio as aio

    from dapo.serve.front import Front, bind_socket

    upstream, url = stub
    upstream.reset()
    front = Front(ServeConfig(device="cpu"), url)
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    loop = aio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        aio.run_coroutine_threadsafe(front.start(sock), loop).result(LIVENESS_S)
        busy, idle = _connect(port), _connect(port)
        busy.sendall(_post("/slow", b"{}"))
        assert upstream.started.wait(LIVENESS_S)
        closing = aio.run_coroutine_threadsafe(front.close(drain_s=GATE_OPENS_BY_ITSELF_S), loop)
        assert _closed(idle)  # an idle keep-alive connection is let go at once
        with pytest.raises(OSError):  # no longer listening
            _connect(port).sendall(_post("/v1/chat/completions", b"{}"))
        assert not closing.done() and not upstream.ended.is_set()
        upstream.gate.set()
        status, _, body = _response(busy)
        assert status == 200 and json.loads(body) == {"done": True} and upstream.completed
        closing.result(LIVENESS_S)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(LIVENESS_S)
        loop.close()
        sock.close()


def test_a_close_without_drain_cuts_the_request_in_flight(stub):
    upstream, url = stub
    with _front(stub) as port:  # front_door closes with the default drain_s=0
        busy = _connect(port)
        busy.sendall(_post("/slow", b"{}"))
        assert upstream.started.wait(LIVENESS_S)
    assert _closed(busy) and upstream.ended.wait(LIVENESS_S) and not upstream.completed
