"""The bound on request bodies still arriving (slow-loris), on the server's FastAPI app under uvicorn on loopback (no
Ray) with real sockets: with the cap full of stalled uploads, a client whose body trails its headers is still answered
(within the grace without touching anyone; past it by dropping the oldest stalled upload)."""

from __future__ import annotations

import json
import socket
import time

import pytest

uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed")

from dapo.serve.config import ServeConfig  # noqa: E402
from tests.serve.serve_helpers import sends_nothing, uvicorn_app  # noqa: E402

CAP = 3
GRACE_S = 1.0


@pytest.fixture(scope="module")
def port():
    from dapo.serve.server import OpenAIServer

    server = OpenAIServer(
        ServeConfig(device="cpu", max_unfinished_uploads=CAP, body_timeout_s=30, body_grace_s=GRACE_S)
    )
    with uvicorn_app(server) as port:
        yield port


def _headers(length: int) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


def _status(sock: socket.socket) -> int:
    return int(sock.recv(200).split(b"\r\n", 1)[0].split()[1])


def _stall(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(_headers(4000) + b'{"model": "tiny-qwen2", ')
    return s


def test_a_late_body_is_answered_and_the_oldest_stalled_upload_is_dropped(port):
    body = json.dumps(
        {"model": "tiny-qwen2", "messages": [{"role": "user", "content": "1 + 1 ="}], "max_tokens": 2, "temperature": 0}
    ).encode()
    stalled = [_stall(port) for _ in range(CAP)]
    try:
        time.sleep(GRACE_S + 0.5)  # past their grace: the stalled uploads hold every slot
        # A body 0.1 s behind its headers (a loaded client, a separate segment) is within the grace: answered, and
        # nobody is dropped for it.
        within = socket.create_connection(("127.0.0.1", port), timeout=20)
        within.sendall(_headers(len(body)))
        time.sleep(0.1)
        within.sendall(body)
        assert _status(within) == 200
        within.close()
        assert all(sends_nothing(s) for s in stalled)
        # A body past the grace needs a slot: the oldest stalled upload is dropped at once (its body timeout is
        # 30 s), and the late client is answered.
        late = socket.create_connection(("127.0.0.1", port), timeout=20)
        late.sendall(_headers(len(body)))
        time.sleep(GRACE_S + 0.5)
        stalled[0].settimeout(5)
        assert _status(stalled[0]) == 503
        late.sendall(body)
        assert _status(late) == 200
        late.close()
        assert all(sends_nothing(s) for s in stalled[1:])  # the younger stalled uploads still hold their slots
    finally:
        for s in stalled:
            s.close()
