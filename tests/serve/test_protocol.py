"""Request checking and the server logic in-process (plain FastAPI, no Ray): every bad request is a 4xx."""

from __future__ import annotations

import json

import pytest

from dapo.serve.config import ServeConfig, ServeConfigError
from dapo.serve.protocol import APIError, parse_json, parse_request

fastapi_testclient = pytest.importorskip("fastapi.testclient", reason="fastapi is not installed")

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_parse_defaults_and_max_completion_tokens_wins():
    req = parse_request("chat", {**CHAT, "max_tokens": 5, "max_completion_tokens": 7}, max_n=4)
    assert (req.n, req.temperature, req.top_p, req.max_tokens, req.stream) == (1, 1.0, 1.0, 7, False)


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({**CHAT, "messages": []}, "messages"),
    ({**CHAT, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({**CHAT, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({**CHAT, "n": 0}, "n"), ({**CHAT, "n": 5}, "n"), ({**CHAT, "n": True}, "n"),
    ({**CHAT, "temperature": "hot"}, "temperature"), ({**CHAT, "top_p": 0}, "top_p"),
    ({**CHAT, "max_tokens": 0}, "max_tokens"), ({**CHAT, "stop": 3}, "stop"),
    ({**CHAT, "stream": "yes"}, "stream"), ({**CHAT, "seed": 1.5}, "seed"),
])
def test_bad_fields_name_the_parameter(body, param):
    with pytest.raises(APIError) as e:
        parse_request("chat", body, max_n=4)
    assert e.value.status == 400 and e.value.param == param


def test_completion_prompt_shapes():
    assert parse_request("completion", {"model": "m", "prompt": "a"}, max_n=1).prompts == ["a"]
    assert parse_request("completion", {"model": "m", "prompt": [1, 2]}, max_n=1).prompts == [[1, 2]]
    with pytest.raises(APIError):
        parse_request("completion", {"model": "m", "prompt": [1, "a"]}, max_n=1)


def test_malformed_json():
    for body in (b"{", b"[1]", b"\xff"):
        with pytest.raises(APIError):
            parse_json(body)


def test_serve_run_arguments_are_parsed():
    cfg = ServeConfig.from_args({"model": "/m/qwen", "tensor-parallel-size": "8", "num_replicas": "none"})
    assert cfg.tensor_parallel_size == 8 and cfg.num_replicas is None and cfg.model_name == "qwen"
    with pytest.raises(ServeConfigError):
        ServeConfig.from_args({"tensor-parallel-sise": "8"})


def test_deployment_options_follow_the_published_layout():
    ray_app = pytest.importorskip("dapo.serve.ray_app", reason="Ray Serve is not installed")
    opts = ray_app.deployment_options(ServeConfig(tensor_parallel_size=4), gpus=8)
    assert opts["num_replicas"] == 2 and opts["placement_group_strategy"] == "STRICT_PACK"
    assert len(opts["placement_group_bundles"]) == 4 and opts["max_ongoing_requests"] == 256
    assert ray_app.deployment_options(ServeConfig(), gpus=0)["num_replicas"] == 1


@pytest.fixture(scope="module")
def http():
    from dapo.serve.server import OpenAIServer, create_app

    server = OpenAIServer(ServeConfig(device="cpu", max_body_bytes=10_000, max_n=4))
    with fastapi_testclient.TestClient(create_app(server)) as c:
        yield c
    server.close()


def _chat(http, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post("/v1/chat/completions", content=data, headers={"content-type": "application/json"})


def test_in_process_chat_completion(http):
    r = _chat(http, {"model": "tiny-qwen2", "messages": [{"role": "user", "content": "3 + 4"}], "max_tokens": 8,
                     "temperature": 0, "n": 2})
    assert r.status_code == 200
    body = r.json()
    assert len(body["choices"]) == 2 and body["choices"][0]["message"]["content"] == body["choices"][1]["message"]["content"]


@pytest.mark.parametrize("body, status", [
    (b"{oops", 400),
    ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404),
    ({"model": "tiny-qwen2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**7}, 400),
    ({"model": "tiny-qwen2", "messages": [{"role": "user", "content": "x " * 600}], "max_tokens": 4}, 400),
    ({"model": "tiny-qwen2", "messages": [{"role": "user", "content": "x" * 20_000}]}, 413),
])
def test_in_process_errors(http, body, status):
    r = _chat(http, body)
    assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert http.get("/health").status_code == 200


def test_unknown_route_is_openai_style_404(http):
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_ingress_routes_take_no_query_parameters():
    """Ray Serve rewrites class-method routes; on FastAPI >= 0.137 that left every route asking for a query parameter
    (``self``/``request``) and answering 422. The routes must need nothing but the request, on the installed FastAPI."""
    ray_app = pytest.importorskip("dapo.serve.ray_app", reason="Ray Serve is not installed")
    from ray.serve._private.http_util import make_fastapi_class_based_view

    make_fastapi_class_based_view(ray_app.api, ray_app.DapoOpenAIServer.func_or_class)  # what serve.run does
    client = fastapi_testclient.TestClient(ray_app.api, raise_server_exceptions=False)
    for method, path in (("get", "/health"), ("get", "/v1/models"), ("post", "/v1/chat/completions")):
        assert getattr(client, method)(path).status_code != 422, path  # outside a replica: 500, never 422
