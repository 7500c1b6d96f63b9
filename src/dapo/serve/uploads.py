"""The bounds on a request body while it arrives (slow-loris uploads), in one place.

``dapo serve`` holds every request to them in its front door (:mod:`dapo.serve.front`), before anything reaches Ray.
The replica holds requests to them too, for ``serve run dapo.serve:build_app``, where Ray Serve's proxy faces clients
directly; behind the front a body reaches the replica whole, well within the grace, so the replica's check costs
nothing there and never refuses.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator

from dapo.serve.config import ServeConfig
from dapo.serve.protocol import APIError


class UploadSlots:
    """At most ``cap`` bodies awaited past their grace at once. When one more needs a slot the OLDEST upload is
    dropped, not the newcomer: a stalled upload holds a slot only until ``cap`` newer slow bodies arrive, and a
    well-behaved client whose body trails its headers is never refused because stallers got there first (refusing the
    newcomer did exactly that in CI: 320 stalled uploads, a normal request answered 503)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held: collections.deque[asyncio.Future] = collections.deque()  # one per upload, oldest first

    def __len__(self) -> int:
        return len(self._held)

    def take(self) -> asyncio.Future:
        """A slot; the future it returns is resolved when a newer upload evicts this one."""
        if len(self._held) >= self.cap:
            self._held.popleft().set_result(None)
        evicted = asyncio.get_running_loop().create_future()
        self._held.append(evicted)
        return evicted

    def release(self, slot: asyncio.Future) -> None:
        if slot in self._held:
            self._held.remove(slot)


def check_declared_length(length: str | None, limit: int) -> None:
    """413 for a ``Content-Length`` over ``limit``, before a byte of the body is read."""
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(
            413, f"request body of {length} bytes is over the limit of {limit} bytes", code="request_too_large"
        )


async def read_body(chunks: AsyncIterator[bytes], length: str | None, cfg: ServeConfig, slots: UploadSlots) -> bytes:
    """The whole body from ``chunks``, within ``cfg.max_body_bytes`` (413), ``cfg.body_timeout_s`` from now (408) and
    ``slots`` once past ``cfg.body_grace_s`` (503 when a newer upload evicts it)."""
    limit = cfg.max_body_bytes
    check_declared_length(length, limit)
    parts: list[bytes] = []

    async def read_all() -> None:
        size = 0
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"request body is over the limit of {limit} bytes", code="request_too_large")
            parts.append(chunk)

    reading = asyncio.ensure_future(read_all())
    reading.add_done_callback(lambda t: t.cancelled() or t.exception())  # a failure after we stopped waiting: quiet
    # A well-behaved client's body is whole within the grace (on a loaded machine Ray's proxy forwarded it to the
    # replica up to hundreds of ms after the headers: a 50 ms window let a persistent attacker's newer uploads evict
    # it), and such a request never takes a slot. Uploads within their grace are bounded by the attacker's connection
    # rate x the grace.
    evicted = None
    try:
        done, _ = await asyncio.wait({reading}, timeout=cfg.body_grace_s)
        if not done:
            evicted = slots.take()
            await asyncio.wait(
                {reading, evicted}, timeout=cfg.body_timeout_s - cfg.body_grace_s, return_when=asyncio.FIRST_COMPLETED
            )
    finally:
        if evicted is not None:
            slots.release(evicted)
        if not reading.done():
            reading.cancel()
            await asyncio.wait({reading})  # a stream refuses the next read until this one has ended
    if not reading.cancelled():
        reading.result()  # 413, or the connection broke
        return b"".join(parts)
    if evicted is not None and evicted.done():
        raise APIError(
            503,
            f"the server awaits at most {slots.cap} request bodies at once and this one was the "
            "oldest still arriving; send the body with the headers, or retry",
            type_="server_error",
            code="too_many_uploads",
        )
    raise APIError(408, f"the request body did not arrive within {cfg.body_timeout_s:g} s", code="request_timeout")
