"""R3 through asynchronous rollouts: a spawned rollout worker records the routes of a tiny Qwen3-MoE and returns
them per token; under partial rollouts (a push between two segments) each token keeps the routes recorded when the
engine fed it, under the weights of its time, and the prompt keeps the first segment's."""

from __future__ import annotations

from pathlib import Path

import torch
from families import build_tiny_model, save_tiny_model

from dapo.config import ModelConfig
from dapo.model.router_replay import router_replay
from dapo.rollout.base import SamplingParams
from dapo.rollout.spec import EngineSpec
from dapo.rollout.worker import RemoteEngine, WorkerOptions

PROMPT = [5, 9, 14, 3, 7, 21]
CHUNK = 2  # tokens per segment


def forward_routes(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """The ``[tokens, layers, k]`` experts a teacher-forced forward of ``model`` routes ``token_ids`` to."""
    with router_replay(model, rollout_routes=True) as tape, tape.recording(), torch.no_grad():
        model(torch.tensor([token_ids]))
        return tape.take()


def test_partial_rollout_routes_are_the_ones_recorded_when_each_token_was_fed(tmp_path: Path) -> None:
    """Version 0 draws the first segment, version 1 (other random weights) the rest. Expected per position: the
    prompt and the first segment's tokens but its last are routed by version 0 (the first segment fed them); the
    first segment's last token and every later token but the last by version 1 (the later segments fed them); the
    last token, never fed, has none (-1), as in one call. Keeping only the last segment's routes, or the prompt's as
    a later segment re-recorded them, gives version 1's routes where version 0's are expected."""
    folder = save_tiny_model("qwen3_moe", tmp_path / "model")
    before, after = build_tiny_model("qwen3_moe", 1), build_tiny_model("qwen3_moe", 2)
    engine = RemoteEngine.start(
        EngineSpec(name="hf"),
        ModelConfig(path=str(folder)),
        WorkerOptions(num_threads=1, partial_chunk_tokens=CHUNK, record_routes=True),
    )
    try:
        engine.push_weights(before.named_parameters(), version=0)
        request = engine.submit([PROMPT], SamplingParams(n=2, max_tokens=8, seed=3, prompt_seeds=(9,)))
        engine.push_weights(after.named_parameters(), version=1)  # served after the request's first segment
        done = engine.receive(timeout=300)
    finally:
        engine.close()
    assert [d.request_id for d in done] == [request]
    output, versions = done[0].output, done[0].token_versions
    assert output.routed_experts is not None
    spanning = [k for k, v in enumerate(versions) if set(v) == {0, 1}]
    assert spanning, f"no sample spans the push: {versions}"
    for k in spanning:
        response, routes = output.response_ids[k], output.routed_experts[k]
        assert versions[k][:CHUNK] == [0] * CHUNK  # the first segment under version 0, the rest under 1
        first = len(PROMPT) + CHUNK - 1  # positions version 0 fed
        old = forward_routes(before, PROMPT + response[:CHUNK])[:first]
        new = forward_routes(after, PROMPT + response[:-1])[first:]
        assert routes.shape == (len(PROMPT) + len(response), *old.shape[1:])
        assert torch.equal(routes[:first], old)
        assert torch.equal(routes[first:-1], new)
        assert bool((routes[-1] == -1).all())
        # the versions route the prompt differently: a later segment's prompt routes would not pass
        assert not torch.equal(forward_routes(after, PROMPT), old[: len(PROMPT)])
