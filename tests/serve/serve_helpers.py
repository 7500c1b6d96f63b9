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


class ScriptedEngine:
    """An engine whose every answer is ``script`` (its last token should be a stop token), reported step by step as the
    Transformers engine reports them (:class:`dapo.rollout.base.TokenStreamingEngine`): a stand-in for a model that
    writes characters spelled over several tokens, which the embedded model never does. A row the batcher continues
    (its prompt followed by the script's first k tokens) goes on from token k."""

    def __init__(self, script: list[int], stop_token: int) -> None:
        self.script, self.stop_token = list(script), stop_token

    def _position(self, prompt: list[int]) -> int:
        return max((k for k in range(len(self.script) + 1) if k <= len(prompt) and
                    (k == 0 or list(prompt[-k:]) == self.script[:k])), default=0)

    def generate(self, prompt_token_ids, params):
        return self.generate_streaming(prompt_token_ids, params, lambda rows, tokens, logprobs: False)

    def generate_streaming(self, prompt_token_ids, params, on_step):
        from dapo.rollout.base import RolloutOutput

        rows = [i for i in range(len(prompt_token_ids)) for _ in range(params.n)]
        answers = [self.script[self._position(prompt_token_ids[i]):][:params.max_tokens] for i in rows]
        for step in range(max((len(a) for a in answers), default=0)):
            live = [k for k, a in enumerate(answers) if step < len(a)]
            if on_step(live, [answers[k][step] for k in live], [-0.25] * len(live)):
                answers = [a[:step + 1] for a in answers]
                break
        reasons = ["stop" if a and a[-1] == self.stop_token else "length" for a in answers]
        return RolloutOutput(rows, answers, [[-0.25] * len(a) for a in answers], reasons)

    def close(self) -> None:
        pass
