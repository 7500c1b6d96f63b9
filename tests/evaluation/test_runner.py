"""run_eval: streamed samples, resume equals uninterrupted, repeats == --n, and the server backend's retries."""

from __future__ import annotations

import json

import httpx
import pytest

from dapo.evaluation.backends import EvalError, LocalBackend, OpenAIBackend
from dapo.evaluation.problems import load_problems
from dapo.evaluation.runner import EvalSettings, read_samples, run_eval, summary_path
from tests.evaluation.eval_helpers import answering_engine, dapo_row, write_jsonl
from tests.harness.engines import ScriptedEngine
from tests.harness.ports import free_port
from tests.harness.tokenizers import CharTokenizer


def _problems(tmp_path, repeats=1, count=5):
    rows = [
        dapo_row(f"Problem {i}: what is {i % 4}?", str(i % 4), index=i) for i in range(count) for _ in range(repeats)
    ]
    return load_problems([write_jsonl(tmp_path / f"t{repeats}.jsonl", rows)])


def _settings(**kw):
    base = dict(
        model="fake", test_files=("t.jsonl",), n=4, temperature=1.0, top_p=1.0, max_tokens=64, seed=3, batch_size=2
    )
    base.update(kw)
    return EvalSettings(**base)


def _local(engine=None):
    return LocalBackend(engine or answering_engine(), CharTokenizer())


def _metrics(path):
    return json.loads(summary_path(path).read_text())["metrics"]


def test_every_sample_is_written_and_scored(tmp_path):
    out = tmp_path / "o.jsonl"
    summary = run_eval(_problems(tmp_path), _local(), _settings(), out)
    rows = read_samples(out)
    assert len(rows) == 20 and summary["status"] == "complete"
    assert {
        "problem_key",
        "problem_id",
        "prompt",
        "response",
        "prediction",
        "score",
        "acc",
        "finish_reason",
        "prompt_tokens",
        "response_tokens",
    } <= set(rows[0])
    for r in rows:
        assert r["acc"] == (r["prediction"] == r["ground_truth"])
    acc = sum(r["acc"] for r in rows) / len(rows)
    assert summary["metrics"]["overall"]["avg@4"] == pytest.approx(acc)


def test_resume_equals_uninterrupted_and_skips_finished_work(tmp_path):
    problems = _problems(tmp_path)
    full = tmp_path / "full.jsonl"
    run_eval(problems, _local(), _settings(), full)
    part = tmp_path / "part.jsonl"
    run_eval(problems, _local(), _settings(), part)
    lines = part.read_bytes().split(b"\n")
    part.write_bytes(b"\n".join(lines[:9]) + b"\n" + lines[9][:7])  # killed mid-line in the 3rd chunk
    engine = answering_engine()
    run_eval(problems, _local(engine), _settings(), part)
    assert len(engine.calls) == 2  # chunks 2 (torn) and 3; chunk 1 was complete
    assert _metrics(part) == _metrics(full)
    key = lambda r: (r["problem_key"], r["sample_index"])  # noqa: E731
    assert sorted(read_samples(part), key=key) == sorted(read_samples(full), key=key)
    engine = answering_engine()
    run_eval(problems, _local(engine), _settings(), part)  # nothing left to do
    assert len(engine.calls) == 0


def test_resume_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "o.jsonl"
    problems = _problems(tmp_path)
    run_eval(problems, _local(), _settings(), out)
    with pytest.raises(EvalError, match="other settings.*temperature"):
        run_eval(problems, _local(), _settings(temperature=0.5), out)


def test_repeated_file_and_n_give_the_same_avg(tmp_path):
    repeated = _problems(tmp_path, repeats=4)
    dedup = _problems(tmp_path, repeats=1)
    assert [p.repeats for p in repeated] == [4] * 5
    a = run_eval(repeated, _local(), _settings(n=1), tmp_path / "a.jsonl")["metrics"]
    b = run_eval(dedup, _local(), _settings(n=4), tmp_path / "b.jsonl")["metrics"]
    assert a == b and "avg@4" in a["overall"]


# ------------------------------------------------------------------------------------------------ server backend
def _chat_body(text="Answer: 1"):
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def test_openai_backend_retries_429_and_5xx_then_succeeds(tmp_path):
    calls = {"chat": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        calls["chat"] += 1
        if calls["chat"] % 3 == 1:
            return httpx.Response(429, json={"error": {"message": "slow down"}}, headers={"retry-after": "0"})
        if calls["chat"] % 3 == 2:
            return httpx.Response(503, json={"error": {"message": "busy"}})
        return httpx.Response(200, json=_chat_body())

    backend = OpenAIBackend(
        "http://127.0.0.1:9/v1", None, concurrency=2, backoff_s=0.001, transport=httpx.MockTransport(handler)
    )
    summary = run_eval(_problems(tmp_path, count=2), backend, _settings(n=2, backend="openai"), tmp_path / "o.jsonl")
    assert summary["status"] == "complete" and calls["chat"] == 12
    assert backend.model == "m"


def test_openai_backend_stops_on_a_4xx_with_the_servers_message(tmp_path):
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(400, json={"error": {"message": "max_tokens too large"}})

    backend = OpenAIBackend("http://127.0.0.1:9", "m", backoff_s=0.001, transport=httpx.MockTransport(handler))
    with pytest.raises(EvalError, match="400: max_tokens too large"):
        run_eval(_problems(tmp_path, count=1), backend, _settings(n=1, backend="openai"), tmp_path / "o.jsonl")


def test_unreachable_server_names_the_url(tmp_path):
    port = free_port()  # a loopback port nobody listens on
    backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff_s=0.001)
    with pytest.raises(EvalError, match=f"cannot reach the server at http://127.0.0.1:{port}/v1"):
        run_eval(_problems(tmp_path, count=1), backend, _settings(n=1, backend="openai"), tmp_path / "o.jsonl")


def test_eval_scores_the_models_tokens_not_what_the_tool_printed(tmp_path):
    # #39 item 8 in dapo eval: a multi-turn response whose tool printed the right "Answer:" line and whose model wrote
    # none is wrong; the recorded response is still the whole trajectory.
    from dapo.rollout.multi_turn import MultiTurnOutput

    class ToolPrintsTheAnswer(ScriptedEngine):
        def generate(self, prompt_token_ids, params):
            model, tool = CharTokenizer().encode("let me run it\n"), CharTokenizer().encode("```output\nAnswer: 0\n```")
            rows = [model + tool for _ in prompt_token_ids for _ in range(params.n)]
            return MultiTurnOutput(
                [i for i, _ in enumerate(prompt_token_ids) for _ in range(params.n)],
                rows,
                [[0.0] * len(r) for r in rows],
                ["stop"] * len(rows),
                action_mask=[[1] * len(model) + [0] * len(tool) for _ in rows],
                turns=[2] * len(rows),
                tool_categories=[["ok"]] * len(rows),
            )

    problems = load_problems([write_jsonl(tmp_path / "t.jsonl", [dapo_row("what is 0?", "0", index=0)])])
    settings = EvalSettings(
        model="fake", test_files=("t.jsonl",), n=2, temperature=1.0, top_p=1.0, max_tokens=64, seed=3, batch_size=2
    )
    out = tmp_path / "o.jsonl"
    run_eval(problems, LocalBackend(ToolPrintsTheAnswer(lambda prompts, params: []), CharTokenizer()), settings, out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["acc"] for r in rows] == [False, False]
    assert all(r["response"].endswith("Answer: 0\n```") for r in rows)
