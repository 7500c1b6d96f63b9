"""Helpers of the serving tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.harness.ports import free_port


def sends_nothing(sock: socket.socket, wait_s: float = 0.2) -> bool:
    """True when the server sends nothing on ``sock`` (no answer, no close) within ``wait_s``."""
    sock.settimeout(wait_s)
    try:
        sock.recv(200)
    except socket.timeout:
        return True
    return False


@contextmanager
def asgi_server(app) -> Iterator[int]:
    """Serves the ASGI ``app`` under uvicorn on a free loopback port, in a thread; yields the port, then stops."""
    import uvicorn

    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not uv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        uv.should_exit = True
        thread.join(30)


@contextmanager
def uvicorn_app(server) -> Iterator[int]:
    """Serves ``server``'s FastAPI app under uvicorn on a free loopback port (no Ray), in a thread; yields the port,
    then stops uvicorn and closes the server."""
    from dapo.serve.server import create_app

    try:
        with asgi_server(create_app(server)) as port:
            yield port
    finally:
        server.close()


@contextmanager
def front_door(cfg, upstream: str) -> Iterator[int]:
    """Runs :class:`dapo.serve.front.Front` for ``upstream`` on a free loopback port, its event loop in a thread;
    yields the port."""
    import asyncio

    from dapo.serve.front import Front, bind_socket

    front = Front(cfg, upstream)
    sock = bind_socket("127.0.0.1", 0)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(front.start(sock), loop).result(30)
        yield sock.getsockname()[1]
    finally:
        asyncio.run_coroutine_threadsafe(front.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        sock.close()


def continues(script: list[int]):
    """A :class:`tests.harness.engines.ScriptedEngine` script whose every answer is ``script`` (its last token should be
    a stop token): a stand-in for a model that writes characters spelled over several tokens, which the embedded model
    never does. A row the batcher continues (its prompt followed by the script's first k tokens) goes on from token
    k."""

    def position(prompt) -> int:
        return max(
            (k for k in range(len(script) + 1) if k <= len(prompt) and (k == 0 or list(prompt[-k:]) == script[:k])),
            default=0,
        )

    return lambda prompts, params: [script[position(prompt) :] for prompt in prompts for _ in range(params.n)]
