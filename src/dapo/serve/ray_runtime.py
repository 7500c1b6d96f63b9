"""Starting (or joining) the Ray runtime behind ``dapo serve``, and saying in one sentence why it did not start.

Loopback by default. ``ray.init()`` on Linux treats the machine as a cluster node: it replaces a loopback node address
with the machine's external one, and GCS, raylet, the object manager, the dashboard and runtime-env agents, the Serve
controller, the proxy's and every replica's gRPC ports then listen on all interfaces. With
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (read when ``ray`` is imported) Ray keeps the node on 127.0.0.1 and binds
those services there; the one exception, the replica's inter-deployment gRPC server (hard-coded ``[::]:0`` in Ray
Serve), is bound to loopback by :func:`bind_replica_grpc_to_loopback` inside the replica. Joining a cluster
(``--ray-address``) leaves Ray's addresses to the cluster. docs/serving.md lists the ports.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class ServeStartError(RuntimeError):
    """``dapo serve`` cannot start; the message says why and what to do."""


def keep_ray_on_loopback() -> None:
    """Make a local Ray runtime started from this process bind its services to 127.0.0.1 (before ``import ray``)."""
    os.environ.update(LOOPBACK_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # ray already imported (tests): the constant was read at import
        constants.ENABLE_RAY_CLUSTER = False


def free_loopback_port() -> int:
    """A free port on 127.0.0.1, for Ray Serve's proxy behind ``dapo serve``'s front door."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def explain_ray_failure(exc: BaseException, address: str | None) -> str:
    """One sentence for why Ray did not start or connect, with the fix; never Ray's traceback."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = f"{type(exc).__name__} {exc}".lower()
    if "auth" in lowered and ("token" in lowered or "authentication" in lowered):
        return (
            f"Ray at {address or 'the local node'} refused the connection: token authentication failed "
            f"({text[:200]}). Ray >= 2.5x turns token auth on by default: put the cluster's token in RAY_AUTH_TOKEN "
            "(or RAY_AUTH_TOKEN_PATH / ~/.ray/auth_token; `ray get-auth-token` on the head prints it), or start the "
            "cluster with RAY_AUTH_MODE=disabled"
        )
    if "timed out during startup" in lowered:
        return (
            "Ray did not start within its 30 s start-up wait (the machine is busy or short of memory). Try again "
            "when it is quieter, or start Ray yourself (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head`) "
            "and pass --ray-address auto"
        )
    if address:
        return f"cannot connect to the Ray cluster at {address}: {text[:300]}"
    return f"Ray did not start: {text[:300]}"


def start_ray(address: str | None, **init_kwargs: Any) -> None:
    """``ray.init`` for ``dapo serve``: a local loopback-only runtime when ``address`` is None, else join it."""
    if address is None:
        keep_ray_on_loopback()
    import ray

    kwargs: dict[str, Any] = {"include_dashboard": False, "ignore_reinit_error": True, **init_kwargs}
    try:
        ray.init(address=address, **kwargs)
    except Exception as e:  # Ray raises bare Exception/RuntimeError/ConnectionError with multi-line tracebacks
        try:
            ray.shutdown()
        except Exception:
            pass
        raise ServeStartError(explain_ray_failure(e, address)) from None


def bind_replica_grpc_to_loopback() -> None:
    """Inside a replica of a loopback-only server: Ray Serve binds each replica's inter-deployment gRPC server to
    ``[::]:0`` whatever the node's address; rewrite that one address to 127.0.0.1 (a no-op on Ray versions without
    it)."""
    try:
        from ray.serve._private import replica
    except ImportError:
        return
    original = getattr(replica, "add_port_to_grpc_server", None)
    if original is None or getattr(original, "_dapo_loopback", False):
        return

    def add_port(server, address: str):
        if address.startswith("[::]:") or address.startswith("0.0.0.0:"):
            address = "127.0.0.1:" + address.rsplit(":", 1)[1]
        return original(server, address)

    add_port._dapo_loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port
