"""Start the real Ray Serve application on loopback with the embedded tiny model (once per test module)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def ray_serve_app(num_threads: int = 1, **config) -> Iterator[str]:
    """Yields the base URL (``http://127.0.0.1:PORT/v1``) of a running ``dapo.serve:build_app``; shuts Ray down."""
    from dapo.serve.ray_runtime import start_ray

    start_ray(None, num_cpus=2, log_to_driver=False, configure_logging=False)
    import ray
    from ray import serve

    from dapo.serve import build_app

    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {"device": "cpu", "num_threads": num_threads, "num_cpus": 1, "loopback_only": True, **config}
        serve.run(build_app(args), name="dapo", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while httpx.get(f"{url}/health", timeout=10).status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}/health never answered 200")
            time.sleep(0.5)
        yield f"{url}/v1"
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
