"""The front door of ``dapo serve``: a small asyncio HTTP/1.1 server (h11) on the user-facing socket, in the driver
process, that forwards complete requests to Ray Serve's proxy on a loopback port.

Why: Ray Serve's proxy (uvicorn) spends ~8 ms of CPU routing each connection and has no header-read timeout; 320
stalled uploads delayed a normal request 2.5 s, and an attacker re-opening them (~140 connections/s) made every normal
request take 2.4 s. Here a connection costs a parse of its headers, and nothing reaches Ray before the request is whole:

* headers within ``header_timeout_s`` of the connection opening (408, then closed; closed silently if nothing came);
* the body within the bounds of :mod:`dapo.serve.uploads` (413 / 408 / 503 evicting the OLDEST stalled upload);
* keep-alive, an idle connection closed after ``keep_alive_timeout_s``; ``Expect: 100-continue`` answered;
* the response passed through chunk by chunk as it arrives (SSE stays incremental), and a client that goes away
  (end of file on its socket, or a failed write) closes the upstream request, which makes Ray cancel it in the replica.

h11 rather than uvicorn: uvicorn has no header-read timeout either (its ``timeout_keep_alive`` runs only between
requests), and the body bounds need the connection itself (answer and close before the body is read).

Forwarding is HTTP to the proxy through an ``httpx.AsyncClient`` keep-alive pool, not a ``DeploymentHandle``: the
ingress is a FastAPI app that Ray exposes only through its proxy (a handle call to it needs Ray's private
ASGI-over-handle protocol, or a second copy of the routes as handle methods), and going through the proxy keeps its
routing, load balancing across replicas and cancel-on-disconnect exactly as ``serve run`` has them. The pool makes
the cost one loopback hop on a warm connection (~5 ms; docs/serving.md). Errors the front makes itself carry the
OpenAI error body (:class:`dapo.serve.protocol.APIError`) and close the connection: the rest of the request was not
read. Not bounded: a client that never reads its answer holds its request until the answer ends.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import socket

import h11

from dapo.serve.config import ServeConfig
from dapo.serve.protocol import APIError
from dapo.serve.uploads import UploadSlots, check_declared_length, read_body

log = logging.getLogger(__name__)

READ_SIZE = 65536
BACKLOG = 2048  # Ray's proxy (uvicorn) has 2048 too; asyncio's 100 drops the SYNs of a burst of connections
LINGER_S = 1.0
# Headers that describe one hop, not the message (RFC 9110 7.6.1); content-length is recomputed by each side.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"expect",
    }
)


def bind_socket(host: str, port: int) -> socket.socket:
    """The user-facing socket, bound but not yet listening: held from before Ray starts (~30 s), so the port cannot be
    taken meanwhile and clients are refused, not queued, until the server is ready."""
    from dapo.serve.ray_runtime import ServeStartError

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ServeStartError(
            f"cannot listen on {host}:{port}: {e.strerror or e} (another server on that port? "
            "choose another with --port)"
        ) from None
    return sock


def error_response(err: APIError) -> bytes:
    """A whole HTTP response for an error the front answers itself; the connection is closed after it."""
    body = json.dumps(err.body()).encode()
    phrase = http.HTTPStatus(err.status).phrase
    return (
        f"HTTP/1.1 {err.status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


def _forwarded(headers, extra: frozenset = frozenset()) -> list[tuple[bytes, bytes]]:
    named = {t.strip().lower() for name, value in headers if name.lower() == b"connection" for t in value.split(b",")}
    return [
        (name, value)
        for name, value in headers
        if name.lower() not in HOP_BY_HOP and name.lower() not in named and name.lower() not in extra
    ]


class Front:
    """Serves the user-facing socket and forwards whole requests to ``upstream`` (Ray Serve's proxy)."""

    def __init__(self, cfg: ServeConfig, upstream: str) -> None:
        self.cfg = cfg
        self.upstream = upstream.rstrip("/")
        self.uploads = UploadSlots(cfg.max_unfinished_uploads)
        self._client = None
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()
        self._busy: set[asyncio.Task] = set()  # connections with a request in flight (a drain lets them finish)
        self._draining = False

    async def start(self, sock: socket.socket) -> None:
        """Listen on ``sock`` (bound by :func:`bind_socket`)."""
        import httpx

        # No read timeout: a generation takes as long as it takes (the replica bounds the work). Idle pooled
        # connections are dropped well before Ray's proxy drops them (90 s), so a reused one is never half-closed.
        # trust_env=False: an HTTP(S)_PROXY in the environment must not route loopback traffic elsewhere.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0),
            trust_env=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=30.0),
        )
        self._client.headers.clear()  # forward the client's headers, not httpx's defaults (accept-encoding, ...)
        self._server = await asyncio.start_server(self._connection, sock=sock, backlog=BACKLOG, limit=READ_SIZE)

    async def wait_upstream(self, limit_s: float) -> None:
        """Return once the upstream answers ``GET /health`` with 200 (Ray's proxy learns its routes a moment after
        ``serve.run`` returns); RuntimeError after ``limit_s``."""
        import httpx

        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        last = "no answer"
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            while loop.time() < deadline:
                try:
                    r = await client.get(f"{self.upstream}/health")
                    if r.status_code == 200:
                        return
                    last = f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as e:
                    last = f"{type(e).__name__}: {e}"
                await asyncio.sleep(0.2)
        raise RuntimeError(f"Ray Serve's proxy at {self.upstream} did not answer /health within {limit_s:g} s ({last})")

    async def close(self, drain_s: float = 0.0) -> None:
        """Stop listening, then let the requests in flight finish for up to ``drain_s`` seconds (a request that
        arrives meanwhile on a kept-alive connection is answered 503), then cut what is left. SIGTERM used to cut
        every in-flight stream at once, ending it with neither ``[DONE]`` nor an error event."""
        self._draining = True
        if self._server is not None:
            self._server.close()
        for task in list(self._connections - self._busy):  # idle: waiting for a next request that is not wanted
            task.cancel()
        if self._busy and drain_s > 0:
            await asyncio.wait(list(self._busy), timeout=drain_s)
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=5)
        if self._client is not None:
            await self._client.aclose()

    # ------------------------------------------------------------------------------------------------ a connection
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        # asyncio turns Nagle off only for sockets made with proto=IPPROTO_TCP; with it on, a response's body waited
        # for the client's delayed ACK of its headers (+40 ms per request).
        sock = writer.get_extra_info("socket")
        conn = h11.Connection(h11.SERVER)
        try:
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reused = False
            while (request := await self._read_head(conn, reader, writer, reused)) is not None:
                if self._draining:
                    await self._refuse(
                        reader,
                        writer,
                        APIError(503, "the server is shutting down; retry on another one", code="shutting_down"),
                    )
                    return
                self._busy.add(task)
                try:
                    body = await self._read_body(conn, reader, writer, request)
                except APIError as e:
                    await self._refuse(reader, writer, e)
                    return
                try:
                    if not await self._forward(conn, reader, writer, request, body):
                        return
                finally:
                    self._busy.discard(task)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE or self._draining:
                    return  # Connection: close, or HTTP/1.0, or a drain: its answer was the connection's last
                conn.start_next_cycle()
                reused = True
        except h11.RemoteProtocolError as e:  # malformed request, headers over h11's 16 KiB, closed mid-request
            await self._refuse(reader, writer, APIError(e.error_status_hint, f"malformed HTTP request: {e}"))
        except (ConnectionError, asyncio.CancelledError):  # the client went away; the front is closing
            pass
        except Exception:  # never let one connection take the front down
            log.exception("front door: connection failed")
        finally:
            self._connections.discard(task)
            self._busy.discard(task)
            writer.close()

    async def _receive(self, conn: h11.Connection, reader: asyncio.StreamReader, timeout: float | None) -> bool:
        """Feed the client's next bytes (or its end of file) to h11; False when none came within ``timeout``."""
        try:
            data = await asyncio.wait_for(reader.read(READ_SIZE), timeout)
        except TimeoutError:
            return False
        except ConnectionError:
            data = b""
        conn.receive_data(data)
        return True

    async def _read_head(self, conn: h11.Connection, reader, writer, reused: bool) -> h11.Request | None:
        """The next request's headers, or None: the client closed, stayed idle past the keep-alive timeout, or did not
        send whole headers within the header timeout (408 if it had sent part of them)."""
        loop = asyncio.get_running_loop()
        started = bool(conn.trailing_data[0])  # a pipelined request already here
        if reused and not started:
            if not await self._receive(conn, reader, self.cfg.keep_alive_timeout_s):
                return None
            started = True
        deadline = loop.time() + self.cfg.header_timeout_s
        while (event := conn.next_event()) is h11.NEED_DATA:
            if not await self._receive(conn, reader, max(0.0, deadline - loop.time())):
                if started:
                    await self._refuse(
                        reader,
                        writer,
                        APIError(
                            408,
                            f"the request headers did not arrive within {self.cfg.header_timeout_s:g} s",
                            code="request_timeout",
                        ),
                    )
                return None
            started = True
        return event if isinstance(event, h11.Request) else None  # else ConnectionClosed

    async def _read_body(self, conn: h11.Connection, reader, writer, request: h11.Request) -> bytes:
        length = next((v.decode("latin-1") for k, v in request.headers if k == b"content-length"), None)
        check_declared_length(length, self.cfg.max_body_bytes)
        if conn.they_are_waiting_for_100_continue:  # curl waits 1 s for it before sending a body over 1 KiB
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))

        async def chunks():
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    await self._receive(conn, reader, None)
                elif isinstance(event, h11.Data):
                    yield bytes(event.data)
                else:  # EndOfMessage; h11 raises RemoteProtocolError on a connection closed mid-body
                    return

        return await read_body(chunks(), length, self.cfg, self.uploads)

    async def _forward(self, conn: h11.Connection, reader, writer, request: h11.Request, body: bytes) -> bool:
        """Send the request upstream and its answer back; False when the connection must close. Meanwhile the client's
        socket is watched: its end of file cancels the exchange, which closes the upstream connection, and Ray's
        proxy then cancels the request in the replica (a hung-up client's tokens stop being decoded)."""
        if not request.target.startswith(b"/"):
            await self._refuse(reader, writer, APIError(400, "the request target must be a path"))
            return False
        exchange = asyncio.ensure_future(self._exchange(conn, writer, request, body))
        watch = asyncio.ensure_future(reader.read(READ_SIZE))
        try:
            await asyncio.wait({exchange, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                data = b"" if watch.exception() is not None else watch.result()
                if not data and not exchange.done():
                    exchange.cancel()
                    await asyncio.wait({exchange})
                    return False
                conn.receive_data(data)  # a pipelined request (h11 holds it for the next cycle), or end of file
            return await exchange
        finally:
            exchange.cancel()  # a no-op once done; else the front is closing
            watch.cancel()
            # Until the cancelled read has ended, the stream refuses the next request's read.
            await asyncio.wait({watch})

    async def _exchange(self, conn: h11.Connection, writer, request: h11.Request, body: bytes) -> bool:
        import httpx

        upstream = self._client.build_request(
            request.method.decode("ascii"),
            self.upstream + request.target.decode("ascii"),
            headers=_forwarded(request.headers, frozenset({b"content-length"})),
            content=body,
        )
        try:
            response = await self._client.send(upstream, stream=True)
        except httpx.HTTPError as e:
            log.warning(
                "front door: %s %s: Ray Serve's proxy did not answer: %r",
                request.method.decode(),
                request.target.decode(),
                e,
            )
            writer.write(
                error_response(
                    APIError(
                        502,
                        f"the model server behind the front door did not answer ({type(e).__name__}); retry",
                        code="bad_gateway",
                    )
                )
            )
            await writer.drain()
            return False
        try:
            writer.write(
                conn.send(
                    h11.Response(
                        status_code=response.status_code,
                        reason=response.reason_phrase,
                        headers=_forwarded(response.headers.raw),
                    )
                )
            )
            await writer.drain()
            async for chunk in response.aiter_raw():  # as it arrives: a stream's events are not held back
                writer.write(conn.send(h11.Data(data=chunk)))
                await writer.drain()
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            return True
        except httpx.HTTPError as e:  # the upstream broke off mid-answer: the client sees the connection close early
            log.warning(
                "front door: %s %s: the answer broke off: %r", request.method.decode(), request.target.decode(), e
            )
            return False
        finally:
            await response.aclose()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, err: APIError) -> None:
        """Answer ``err`` and end the connection. What the client still sends is read (and dropped) for up to
        ``LINGER_S`` first: closing a socket with unread data makes the kernel reset the connection, and the client
        could lose the answer while it is still sending its body."""
        try:
            writer.write(error_response(err))
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            left = self.cfg.max_body_bytes
            async with asyncio.timeout(LINGER_S):
                while left > 0 and (data := await reader.read(READ_SIZE)):
                    left -= len(data)
        except (OSError, TimeoutError):
            pass
