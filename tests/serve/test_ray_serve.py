"""The real server: Ray Serve on loopback, the embedded tiny model, driven by the official openai client and by
`dapo eval --base-url`; a bounded concurrent load with malformed requests mixed in."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ray[serve]')")
openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install openai)")
import httpx  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from dapo.cli.main import cli  # noqa: E402
from tests.serve.serve_helpers import ray_serve_app  # noqa: E402

MODEL = "tiny-qwen2"
QUESTION = "Solve: Tom has 3 apples and buys 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def base_url():
    with ray_serve_app() as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=120)


def test_models_and_health(client, base_url):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(base_url.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and health["backend"] == "hf"


def test_chat_completion_greedy_is_deterministic_and_counts_usage(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, seed=1,
              max_completion_tokens=32)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].finish_reason in ("stop", "length")
    assert a.usage.completion_tokens >= 1 and a.usage.prompt_tokens > 10
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens


def test_chat_n_samples_seeded_and_logprobs(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=1.0, seed=7, n=3,
              max_tokens=24, logprobs=True)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert len(a.choices) == 3 and [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert all(lp.logprob <= 0 for c in a.choices for lp in c.logprobs.content)
    assert a.usage.completion_tokens == sum(len(c.logprobs.content) for c in a.choices)


def test_completions_with_stop_and_logprobs(client):
    r = client.completions.create(model=MODEL, prompt=["3 + 4 =", "10 - 2 ="], max_tokens=16, temperature=0,
                                  stop=["\n"], logprobs=1)
    assert len(r.choices) == 2
    for c in r.choices:
        assert "\n" not in c.text
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs)


def test_streaming_chat_matches_the_non_streamed_answer(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=32)
    whole = client.chat.completions.create(**kw).choices[0].message.content
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole and finish in ("stop", "length") and usage.completion_tokens >= 1


def test_errors_are_openai_style_4xx(client, base_url):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10**6)
    r = httpx.post(f"{base_url}/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_served_eval_equals_local_eval_at_temperature_0(base_url, tmp_path):
    common = ["eval", "--test-file", "synth", "--max-problems", "6", "--n", "2", "--temperature", "0",
              "--max-tokens", "32", "--seed", "5", "--quiet"]
    runner = CliRunner()
    local = runner.invoke(cli, common + ["--output", str(tmp_path / "local.jsonl")])
    assert local.exit_code == 0, local.output
    served = runner.invoke(cli, common + ["--output", str(tmp_path / "served.jsonl"), "--base-url", base_url,
                                          "--model", MODEL, "--concurrency", "8"])
    assert served.exit_code == 0, served.output
    a = json.loads((tmp_path / "local.summary.json").read_text())["metrics"]
    b = json.loads((tmp_path / "served.summary.json").read_text())["metrics"]
    assert a == b

    def responses(name):
        rows = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        return sorted((r["problem_key"], r["sample_index"], r["response"], r["response_tokens"]) for r in rows)

    assert responses("local.jsonl") == responses("served.jsonl")


def test_concurrent_load_with_malformed_requests(base_url):
    """64 concurrent clients x 2 requests each; every 8th client sends malformed bodies. Bounded: 128 requests."""
    good = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8, "temperature": 1.0}
    bad_bodies = [b"{", json.dumps({"model": MODEL, "messages": "x"}).encode(),
                  json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": "2"}).encode(),
                  json.dumps({"model": "other", "messages": [{"role": "user", "content": "x"}]}).encode()]

    async def one_client(i, http):
        statuses = []
        for j in range(2):
            if i % 8 == 7:
                body = bad_bodies[(i + j) % len(bad_bodies)]
                r = await http.post(f"{base_url}/chat/completions", content=body,
                                    headers={"content-type": "application/json"})
                statuses.append(("bad", r.status_code, r.json()["error"]["message"]))
            else:
                r = await http.post(f"{base_url}/chat/completions", json=good)
                statuses.append(("good", r.status_code, r.json()["choices"][0]["finish_reason"]))
        return statuses

    async def main():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            return await asyncio.wait_for(asyncio.gather(*(one_client(i, http) for i in range(64))), 150)

    results = [s for client_results in asyncio.run(main()) for s in client_results]
    assert len(results) == 128
    assert all(code == 200 for kind, code, _ in results if kind == "good")
    assert all(400 <= code < 500 for kind, code, _ in results if kind == "bad")
    assert httpx.get(base_url.removesuffix("/v1") + "/health").status_code == 200
