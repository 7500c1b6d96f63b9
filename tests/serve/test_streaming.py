"""Incremental streaming, disconnect clean-up and continuous batching of the HF backend: the server's FastAPI app under
uvicorn on loopback (no Ray), driven by the official openai client. The engine's call counter is read in-process, so
the tests check what happened in which order, never how fast. The embedded tiny model answers the completion prompt
"The" greedily with a long run of tokens (no EOS within 128), which makes the long responses here; its tokenizer spells
that text one character or a few per token, so every token adds text."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

openai = pytest.importorskip("openai", reason="the openai client is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed")
import httpx  # noqa: E402

from dapo.serve.config import ServeConfig  # noqa: E402
from tests.harness.engines import ScriptedEngine  # noqa: E402
from tests.serve.serve_helpers import continues, uvicorn_app  # noqa: E402

CHUNK = 4
LONG = {"model": "tiny-qwen2", "prompt": "The", "temperature": 0}


@pytest.fixture(scope="module")
def served():
    from dapo.serve.server import OpenAIServer

    server = OpenAIServer(ServeConfig(device="cpu", decode_chunk_tokens=CHUNK))
    with uvicorn_app(server) as port:
        yield server, f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1], api_key="EMPTY", max_retries=0, timeout=120)


def _wait_idle(server, seconds=30.0):
    deadline = time.monotonic() + seconds
    while server.batcher.active_requests:
        assert time.monotonic() < deadline, "requests never left the batcher"
        time.sleep(0.01)


def test_first_tokens_leave_before_the_last_are_generated(served, client):
    server, _ = served
    _wait_idle(server)
    calls_at_start = server.batcher.engine_calls
    stream = client.completions.create(max_tokens=64, stream=True, stream_options={"include_usage": True}, **LONG)
    seen_calls, pieces, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.text:
                pieces.append(choice.text)
                seen_calls.append(server.batcher.engine_calls - calls_at_start)
    whole = client.completions.create(max_tokens=64, **LONG).choices[0].text
    assert "".join(pieces) == whole and usage.completion_tokens == 64
    # 64 tokens in chunks of 4 take 16 engine calls; the first text arrived while the first calls were made
    assert seen_calls[0] <= 2 and seen_calls[-1] >= 64 // CHUNK - 1 and len(pieces) >= 8


def test_a_client_that_disconnects_mid_stream_frees_its_slot(served):
    server, url = served
    _wait_idle(server)
    body = {**LONG, "max_tokens": 400, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{url}/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data:") and '"text": ""' not in line:
                    break  # the first piece of text: hang up
            assert '"text"' in line and '"finish_reason": null' in line, line  # hung up mid-answer
            calls_at_close = server.batcher.engine_calls
    _wait_idle(server)
    # dropped at the next chunk boundary: a handful of calls, not the ~100 the full response would take
    assert server.batcher.engine_calls - calls_at_close <= 3


def test_a_short_request_arriving_during_a_long_decode_finishes_first(served, client):
    server, _ = served
    _wait_idle(server)
    order: list[str] = []

    def long_request():
        client.completions.create(max_tokens=256, **LONG)
        order.append("long")

    thread = threading.Thread(target=long_request)
    calls_before = server.batcher.engine_calls
    thread.start()
    while server.batcher.engine_calls < calls_before + 2:  # the long decode is under way
        time.sleep(0.005)
    short = client.chat.completions.create(
        model="tiny-qwen2", messages=[{"role": "user", "content": "3 + 4"}], max_tokens=4, temperature=0
    )
    order.append("short")
    thread.join(300)
    assert order == ["short", "long"] and short.choices[0].message.content is not None


def test_stop_strings_across_token_boundaries_and_in_streams(served, client):
    server, _ = served
    whole = client.completions.create(max_tokens=48, **LONG).choices[0].text
    assert len(whole) > 12
    stop = whole[5:9]  # a stop string that need not start or end on a token boundary
    cut = client.completions.create(max_tokens=48, stop=[stop], **LONG)
    assert cut.choices[0].text == whole[: whole.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(max_tokens=48, stop=[stop], stream=True, **LONG)
    pieces, finish = [], None
    for chunk in streamed:
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole[: whole.index(stop)] and finish == "stop"


def test_batcher_round_trip_under_asyncio(served):
    """The batcher answers every row of an n x prompts request exactly once, whatever the chunking."""
    from dapo.rollout.base import SamplingParams

    server, _ = served
    _wait_idle(server)
    prompts = [[55], [55, 56]]

    async def main():
        return await server.batcher.generate(prompts, SamplingParams(n=3, temperature=0, max_tokens=10))

    out = asyncio.run_coroutine_threadsafe(main(), _loop_of(server)).result(120)
    assert [len(per_prompt) for per_prompt in out] == [3, 3]
    for per_prompt in out:
        assert all(sample[0] == per_prompt[0][0] for sample in per_prompt)  # greedy: the n samples agree
        assert all(len(sample[0]) == len(sample[1]) <= 10 for sample in per_prompt)


def _loop_of(server):
    return server.batcher._task.get_loop()


def test_top_logprobs_list_the_most_likely_alternatives(client):
    r = client.chat.completions.create(
        model="tiny-qwen2",
        messages=[{"role": "user", "content": "3 + 4"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    content = r.choices[0].logprobs.content
    assert content
    for entry in content:
        top = entry.top_logprobs
        assert len(top) == 5 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        # greedy: the sampled token is the most likely one, with the same log-prob (up to float rounding)
        assert top[0].token == entry.token and abs(top[0].logprob - entry.logprob) < 1e-3
    r = client.completions.create(model="tiny-qwen2", prompt="The", max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) == 6
    for token_lp, alternatives in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(alternatives) <= 3 and abs(max(alternatives.values()) - token_lp) < 1e-3


# ------------------------------------------------------------------------------------------------ one chunk per token
def _stream_pieces(stream) -> tuple[list[str], object, list]:
    """(content deltas, usage, per-chunk logprob entries) of an openai stream, chat or completions."""
    pieces, usage, logprobs = [], None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text = choice.delta.content if hasattr(choice, "delta") else choice.text
            if text:
                pieces.append(text)
                if choice.logprobs is not None:
                    logprobs.append(choice.logprobs)
    return pieces, usage, logprobs


def test_each_token_is_one_content_chunk_adding_up_to_the_unstreamed_answer(served, client):
    # Before: the text left in chunks of decode_chunk_tokens (here 4) tokens, 10 content chunks for 40 tokens.
    server, _ = served
    _wait_idle(server)
    stream = client.completions.create(
        max_tokens=40, stream=True, stream_options={"include_usage": True}, logprobs=1, **LONG
    )
    pieces, usage, logprobs = _stream_pieces(stream)
    whole = client.completions.create(max_tokens=40, **LONG).choices[0].text
    assert usage.completion_tokens == 40 and len(pieces) == 40
    assert "".join(pieces) == whole
    assert [len(lp.tokens) for lp in logprobs] == [1] * 40 and [lp.tokens[0] for lp in logprobs] == pieces
    messages = [{"role": "user", "content": "Leo has 14 beads and wins 9 more. How many?"}]
    chat = client.chat.completions.create(
        model="tiny-qwen2",
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, _ = _stream_pieces(chat)
    answer = client.chat.completions.create(model="tiny-qwen2", messages=messages, max_tokens=24, temperature=0)
    assert "".join(pieces) == answer.choices[0].message.content
    # an answer that ends on EOS: the EOS token adds no text
    stopped = answer.choices[0].finish_reason == "stop"
    assert len(pieces) == usage.completion_tokens - stopped == answer.usage.completion_tokens - stopped


def test_two_concurrent_streams_decode_together_and_interleave(served, client):
    server, _ = served
    _wait_idle(server)
    arrivals: list[str] = []  # the order in which the two clients received their content chunks
    lock = threading.Lock()
    first_a = threading.Event()
    results = {}

    def read(name: str, max_tokens: int) -> None:
        stream = client.completions.create(
            max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}, **LONG
        )
        pieces, usage = [], None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if choice.text:
                    with lock:
                        arrivals.append(name)
                    pieces.append(choice.text)
                    first_a.set()
        results[name] = (pieces, usage)

    calls_before = server.batcher.engine_calls
    a = threading.Thread(target=read, args=("a", 128))
    a.start()
    assert first_a.wait(120)
    b = threading.Thread(target=read, args=("b", 16))
    b.start()
    a.join(300)
    b.join(300)
    calls = server.batcher.engine_calls - calls_before
    for name, tokens in (("a", 128), ("b", 16)):
        pieces, usage = results[name]
        assert usage.completion_tokens == tokens and len(pieces) == tokens
    assert results["b"][0] == results["a"][0][:16]  # greedy, same prompt: batching changed nothing
    b_first, b_last = arrivals.index("b"), len(arrivals) - 1 - arrivals[::-1].index("b")
    assert "a" in arrivals[b_first:b_last] and "a" in arrivals[b_last:]  # b's tokens arrived among a's
    # b rode along in a's calls (128 / 4 = 32 of them, one more where b's arrival ended a call early), instead of
    # adding its own 4
    assert calls <= 128 // CHUNK + 2


@pytest.fixture(scope="module")
def served_long_calls():
    """A server whose calls may run 512 tokens: only an arrival ends one before its rows do."""
    from dapo.serve.server import OpenAIServer

    server = OpenAIServer(ServeConfig(device="cpu", decode_chunk_tokens=512))
    with uvicorn_app(server) as port:
        yield server, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, timeout=120)


def test_a_request_arriving_during_a_call_joins_after_the_step_under_way(served_long_calls):
    # Before: the short stream waited for the long request's 128-token call to end, so the long one finished first.
    server, client = served_long_calls
    _wait_idle(server)
    order: list[str] = []

    def long_request():
        client.completions.create(max_tokens=128, **LONG)
        order.append("long")

    calls_before = server.batcher.engine_calls
    thread = threading.Thread(target=long_request)
    thread.start()
    while server.batcher.engine_calls == calls_before:  # the long request's call is under way
        time.sleep(0.002)
    pieces, usage, _ = _stream_pieces(
        client.completions.create(max_tokens=4, stream=True, stream_options={"include_usage": True}, **LONG)
    )
    order.append("short")
    thread.join(300)
    assert order == ["short", "long"] and len(pieces) == usage.completion_tokens == 4


def test_a_seeded_sampled_request_is_not_cut_by_arrivals(served_long_calls):
    # Its calls are its own, seeded seed + k for the k-th: ending one early would change what it draws.
    server, client = served_long_calls
    _wait_idle(server)
    kw = dict(model="tiny-qwen2", prompt="The", max_tokens=64, temperature=1.0, seed=11)
    alone = client.completions.create(**kw).choices[0].text
    result = {}
    thread = threading.Thread(target=lambda: result.update(text=client.completions.create(**kw).choices[0].text))
    calls_before = server.batcher.engine_calls
    thread.start()
    while server.batcher.engine_calls == calls_before:
        time.sleep(0.002)
    client.completions.create(max_tokens=4, **LONG)
    thread.join(300)
    assert result["text"] == alone


def test_characters_spelled_over_several_tokens_stream_whole(tmp_path):
    from transformers import AutoTokenizer

    from dapo.model.loading import EMBEDDED_MODEL_DIR
    from dapo.serve.server import OpenAIServer

    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
    text = "Äpfel: 日本語 😀 naïve"
    ids = tokenizer.encode(text, add_special_tokens=False)
    complete = [k for k in range(len(ids)) if not tokenizer.decode(ids[: k + 1]).endswith("\ufffd")]
    assert len(complete) < len(ids)  # some tokens end inside a character
    engine = ScriptedEngine(
        continues(ids + [tokenizer.eos_token_id]), stop_tokens=(tokenizer.eos_token_id,), logprob=-0.25
    )
    server = OpenAIServer(
        ServeConfig(device="cpu", decode_chunk_tokens=4), engine=engine, tokenizer=tokenizer, max_model_len=4096
    )
    with uvicorn_app(server) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, timeout=60)
        pieces, usage, _ = _stream_pieces(
            client.completions.create(
                model="tiny-qwen2", prompt="x", max_tokens=100, stream=True, stream_options={"include_usage": True}
            )
        )
        whole = client.completions.create(model="tiny-qwen2", prompt="x", max_tokens=100).choices[0].text
    assert whole == text and "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert len(pieces) == len(complete)  # one chunk per token that completes a character, each sent at once
    assert usage.completion_tokens == len(ids) + 1
