"""Helpers of the serving tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def uvicorn_app(server) -> Iterator[int]:
    """Serves ``server``'s FastAPI app under uvicorn on a free loopback port (no Ray), in a thread; yields the port,
    then stops uvicorn and closes the server."""
    import uvicorn

    from dapo.serve.server import create_app

    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=port, log_level="warning"))
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
        server.close()
