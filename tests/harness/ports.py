"""Loopback ports for the tests' servers, rendezvous and torchrun masters."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

# The one free-port helper is dapo's own (``dapo serve`` picks Ray Serve's proxy port with it): the tests ask the
# loopback interface for a port the way the code under test does. Nobody listens on it once it returns.
from dapo.serve.ray_runtime import free_loopback_port as free_port

__all__ = ["free_port", "held_port"]


@contextmanager
def held_port() -> Iterator[int]:
    """A loopback port that a socket listens on for the ``with`` block: a port already in use, for a command that
    must refuse to bind it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]
