"""The rollout worker: an engine in a process of its own, fed prompts over a pipe and weights over a gloo process
group. Real processes throughout: the worker is spawned, the weights are broadcast, the probe reads them back."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch

from dapo.config import ModelConfig
from dapo.model.loading import Policy, load_policy
from dapo.rollout.base import FinishedRequest, SamplingParams
from dapo.rollout.factory import EngineSpec, build_rollout_engine
from dapo.rollout.stream import InProcessStream, generate_through
from dapo.rollout.worker import MessageFault, RemoteEngine, RolloutWorkerDied, WorkerOptions
from dapo.training.errors import TrainingError
from dapo.training.weight_sync import WeightSync, actor_log_probs_of

PROMPTS = [[1, 72, 98, 17, 10, 18, 30], [1, 72, 98, 20, 10, 19, 30]]
PROBE = [1, 72, 98, 17, 10, 18, 30, 45, 198, 44, 91, 198, 20]


@pytest.fixture(scope="module")
def actor() -> Policy:
    return load_policy(ModelConfig())  # its own copy: tests below move its weights


@pytest.fixture(scope="module")
def remote() -> Iterator[RemoteEngine]:
    engine = RemoteEngine.start(EngineSpec(name="hf"), ModelConfig(), WorkerOptions(num_threads=1))
    yield engine
    engine.close()


def _perturb(policy: Policy, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))


def test_the_worker_samples_what_the_engine_samples_in_process(actor: Policy, remote: RemoteEngine) -> None:
    params = SamplingParams(n=3, max_tokens=12, seed=5, prompt_seeds=(11, 12))
    here = build_rollout_engine(EngineSpec(name="hf"), load_policy(ModelConfig()))
    expected = here.generate(PROMPTS, params)
    got = remote.generate(PROMPTS, params)
    assert got.response_ids == expected.response_ids and got.finish_reason == expected.finish_reason
    assert torch.allclose(torch.tensor(sum(got.logprobs, [])), torch.tensor(sum(expected.logprobs, [])), atol=1e-5)


def test_a_push_over_the_process_group_changes_the_workers_log_probs(actor: Policy, remote: RemoteEngine) -> None:
    prompt, response = PROBE[:7], PROBE[7:]
    before = torch.tensor(remote.log_probs_of(prompt, response))
    _perturb(actor, 1)
    metrics = remote.push_weights(actor.model.named_parameters(), version=7)
    after = torch.tensor(remote.log_probs_of(prompt, response))
    expected = actor_log_probs_of(actor.model, prompt, response)
    assert (after - before).abs().mean() > 1e-2  # the push moved the engine ...
    assert torch.allclose(after, expected, atol=1e-4)  # ... onto the actor's weights
    sent = sum(p.numel() * p.element_size() for p in actor.model.parameters())
    assert metrics["async/weight_transfer_bytes"] == sent
    assert remote.weight_version == 7


def test_requests_stream_back_tagged_with_the_version_they_were_sampled_under(
    actor: Policy, remote: RemoteEngine
) -> None:
    params = SamplingParams(n=2, max_tokens=6, seed=1, prompt_seeds=(3, 4))
    version = remote.weight_version
    first = remote.submit(PROMPTS, params)  # returns at once; the worker generates meanwhile
    _perturb(actor, 2)
    remote.push_weights(actor.model.named_parameters(), version=version + 1)  # served after the first request
    one = SamplingParams(n=2, max_tokens=6, seed=1, prompt_seeds=(3,))
    second = remote.submit(PROMPTS[:1], one)
    done: dict[int, FinishedRequest] = {}
    while len(done) < 2:
        done.update((r.request_id, r) for r in remote.receive(timeout=120))
    assert {v for sample in done[first].token_versions for v in sample} <= {version}
    assert {v for sample in done[second].token_versions for v in sample} <= {version + 1}
    assert len(done[first].output) == 4 and len(done[second].output) == 2
    aborted = remote.submit(PROMPTS[:1], one)
    remote.abort(aborted)
    assert remote.receive(timeout=60) == [] and not remote._pending  # an aborted request is never returned


def test_a_dropped_push_stops_the_run_with_a_message(actor: Policy) -> None:
    engine = RemoteEngine.start(EngineSpec(name="hf"), ModelConfig(), WorkerOptions(num_threads=1, drop_pushes_after=1))
    try:
        sync = WeightSync(engine, actor.model, PROBE, threshold=0.05)
        sync.push(0)  # the first push arrives: the engine now holds the actor's weights
        _perturb(actor, 3)
        with pytest.raises(TrainingError, match="generating from stale weights"):
            sync.push(1)
    finally:
        engine.close()


def test_the_in_process_stream_is_the_blocking_engine_behind_submit_and_receive(actor: Policy) -> None:
    policy = load_policy(ModelConfig())
    engine = build_rollout_engine(EngineSpec(name="hf"), policy)
    params = SamplingParams(n=2, max_tokens=8, seed=2, prompt_seeds=(5, 6))
    stream = InProcessStream(engine)
    output, versions = generate_through(stream, PROMPTS, params)
    assert output.response_ids == engine.generate(PROMPTS, params).response_ids
    assert all(set(v) <= {0} for v in versions)
    stream.push_weights(policy.model.named_parameters(), version=3)
    _, versions = generate_through(stream, PROMPTS, params)
    assert stream.weight_version == 3 and all(set(v) <= {3} for v in versions)


def test_a_partial_rollout_spans_two_versions_and_each_token_is_scored_under_its_own(actor: Policy) -> None:
    """A push that arrives while a request generates is loaded between two segments: the samples keep their tokens
    and continue under the new weights; each token's log-prob is the one of the weights that drew it."""
    before = load_policy(ModelConfig())
    _perturb(before, 4)  # version 0: the weights the worker is given first
    after = load_policy(ModelConfig())
    _perturb(after, 5)  # version 1
    engine = RemoteEngine.start(
        EngineSpec(name="hf"), ModelConfig(), WorkerOptions(num_threads=1, partial_chunk_tokens=2)
    )
    try:
        engine.push_weights(before.model.named_parameters(), version=0)
        text = before.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 12 + 35?"}], add_generation_prompt=True, tokenize=False
        )
        prompt = before.tokenizer(text)["input_ids"]
        request = engine.submit([prompt], SamplingParams(n=4, max_tokens=24, seed=3, prompt_seeds=(9,)))
        engine.push_weights(after.model.named_parameters(), version=1)  # served after the request's first segment
        done = engine.receive(timeout=300)
    finally:
        engine.close()
    assert [d.request_id for d in done] == [request]
    output, versions = done[0].output, done[0].token_versions
    spanning = [k for k, v in enumerate(versions) if set(v) == {0, 1}]
    assert spanning, f"no sample spans the push: {versions}"
    for k in spanning:
        v = versions[k]
        assert v == sorted(v) and v[:2] == [0, 0]  # the first segment under version 0, the rest under 1
        response = output.response_ids[k]
        expected = torch.where(
            torch.tensor(v) == 0,
            actor_log_probs_of(before.model, prompt, response),
            actor_log_probs_of(after.model, prompt, response),
        )
        assert torch.allclose(torch.tensor(output.logprobs[k]), expected, atol=1e-4), k


@pytest.mark.parametrize("direction", ["reply", "request"])
@pytest.mark.parametrize("garble", [True, False], ids=["garbled", "lost"])
def test_a_garbled_or_lost_message_of_the_worker_stops_it_naming_the_stage_and_a_new_worker_recovers(
    garble: bool, direction: str
) -> None:
    """The worker's reply to a generation (``reply``), or the trainer's request for it (``request``), goes out as a
    frame that is no message, or never goes out (real processes, the fault injected in the sending end): the
    trainer's wait for the generation raises the one error a run restarts a worker on, saying what broke, during
    which stage, and which process. A lost reply shows at the worker's next heartbeat (its number skips one), a lost
    request at the trainer's next heartbeat, which the worker reads while it waits (the number it names is the one
    missing). A respawned worker (as a run restarts one) serves the request."""
    params = SamplingParams(n=2, max_tokens=6, seed=1, prompt_seeds=(3, 4))
    fault = MessageFault("finished" if direction == "reply" else "generate", garble=garble)
    engine = RemoteEngine.start(
        EngineSpec(name="hf"),
        ModelConfig(),
        WorkerOptions(num_threads=1, stall_timeout_s=60, **{f"{direction}_fault": fault}),
    )
    fresh = None
    try:
        pid = engine._process.pid
        with pytest.raises(RolloutWorkerDied) as died:
            engine.generate(PROMPTS, params)
        message = str(died.value)
        assert (
            f"the control channel to the rollout worker (pid {pid}) broke while the trainer waited for "
            "generation" in message
        ), message
        if direction == "reply":
            assert ("could not be read (UnpicklingError" if garble else "never arrived (message") in message, message
        elif garble:
            assert re.search(r"the trainer's message \d+ could not be read \(UnpicklingError", message), message
        else:
            lost = re.search(
                r"the trainer's message (\d+) never reached the worker \(message (\d+) came next\)", message
            )
            assert lost and int(lost[2]) == int(lost[1]) + 1, message
        assert "Traceback" not in message and "\n" not in message
        fresh = engine.respawn()  # closes the broken one
        assert not engine._process.is_alive() and fresh.restarts == 1
        assert len(fresh.generate(PROMPTS, params).response_ids) == 4
    finally:
        engine.close()
        if fresh is not None:
            fresh.close()


def test_a_lora_actors_adapter_only_push_moves_the_worker_onto_the_actor() -> None:
    """A LoRA trainer pushes only its adapters (the frozen base never changes): the spawned worker's engine carries
    the same adapters, so the push lands under their names and the engine scores as the adapted actor does. Without
    adapters in the worker the push names parameters its model lacks (the bug this guards against)."""
    from dapo.model.lora import adapter_named_parameters, with_lora

    cfg = ModelConfig(lora_rank=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    actor = with_lora(load_policy(cfg), cfg)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, p in adapter_named_parameters(actor.model):
            p.copy_(0.3 * torch.randn(p.shape, generator=generator))  # B != 0: the adapters change the function
    prompt, response = PROBE[:7], PROBE[7:]
    base = actor_log_probs_of(load_policy(ModelConfig()).model, prompt, response)
    expected = actor_log_probs_of(actor.model, prompt, response)
    assert (expected - base).abs().mean() > 1e-2
    remote = RemoteEngine.start(EngineSpec(name="hf"), cfg, WorkerOptions(num_threads=1))
    try:
        assert torch.allclose(torch.tensor(remote.log_probs_of(prompt, response)), base, atol=1e-5)  # B = 0 there
        metrics = remote.push_weights(adapter_named_parameters(actor.model), version=1)
        got = torch.tensor(remote.log_probs_of(prompt, response))
    finally:
        remote.close()
    assert torch.allclose(got, expected, atol=1e-5)
    sent = sum(p.numel() * p.element_size() for _, p in adapter_named_parameters(actor.model))
    assert metrics["async/weight_transfer_bytes"] == sent  # the adapters only
