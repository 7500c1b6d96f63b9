"""rollout.name picks the engine through one factory; what a caller gets is only the RolloutEngine interface."""

from __future__ import annotations

import pytest
import torch

from dapo.config import build_config
from dapo.model.loading import Policy, load_policy
from dapo.rollout import factory
from dapo.rollout.base import RolloutEngine, SamplingParams
from dapo.rollout.factory import EngineSpec, EngineUnavailableError, build_rollout_engine


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(build_config().model)


def test_hf_engine_shares_the_actors_module(policy: Policy) -> None:
    engine = build_rollout_engine(EngineSpec(name="hf", max_batch_size=4), policy)
    assert isinstance(engine, RolloutEngine)
    assert engine.model is policy.model and engine.max_batch_size == 4
    # a push of the actor's own tensors is a no-op, and sampling works through the interface
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    engine.update_weights(policy.model.named_parameters())
    assert all(torch.equal(before[n], p) for n, p in policy.model.named_parameters())
    out = engine.generate([[1, 2, 3]], SamplingParams(n=2, max_tokens=4, seed=0))
    assert len(out) == 2
    engine.close()


def test_policy_records_its_hugging_face_folder(policy: Policy) -> None:
    assert policy.hf_dir is not None and (policy.hf_dir / "config.json").is_file()


def test_vllm_unavailable_is_a_clear_error(policy: Policy, monkeypatch: pytest.MonkeyPatch) -> None:
    import dapo.rollout.vllm_engine as vllm_engine

    monkeypatch.setattr(
        vllm_engine, "vllm_available", lambda: (False, "vLLM is not installed (bash scripts/install_vllm_cpu.sh)")
    )
    with pytest.raises(EngineUnavailableError, match=r"rollout.name=vllm: vLLM is not installed"):
        build_rollout_engine(EngineSpec(name="vllm"), policy)


def test_vllm_needs_a_hugging_face_folder(policy: Policy, monkeypatch: pytest.MonkeyPatch) -> None:
    import dapo.rollout.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: (True, ""))
    folderless = Policy(policy.model, policy.tokenizer, policy.eos_token_ids, policy.pad_token_id, "gguf", hf_dir=None)
    with pytest.raises(EngineUnavailableError, match="save_pretrained_cache"):
        build_rollout_engine(EngineSpec(name="vllm"), folderless)


def test_every_list_of_engine_names_is_the_registry(policy: Policy) -> None:
    from dapo.cli.eval_cmd import eval_command
    from dapo.cli.generate_cmd import generate_command
    from dapo.serve.config import BACKENDS

    assert factory.ENGINE_NAMES == tuple(factory.ENGINES) == ("hf", "vllm")
    assert BACKENDS == ("auto", *factory.ENGINE_NAMES)
    for command in (eval_command, generate_command):
        backend = next(p for p in command.params if p.name == "backend")
        assert tuple(backend.type.choices) == ("auto", *factory.ENGINE_NAMES)
    with pytest.raises(EngineUnavailableError, match=r"rollout.name: unknown engine 'sglang'; choose one of hf, vllm"):
        build_rollout_engine(EngineSpec(name="sglang"), policy)


def test_an_unknown_engine_stops_the_run_before_the_model_loads(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dapo.training import run

    monkeypatch.setattr(run, "load_policy", lambda *a, **k: pytest.fail("the model loaded before the name check"))
    cfg = build_config({}, ["rollout.name=sglang", f"trainer.default_local_dir={tmp_path}"])
    with pytest.raises(EngineUnavailableError, match="rollout.name: unknown engine 'sglang'"):
        run.build_run(cfg)


def test_tensor_parallel_with_the_transformers_engine_is_refused(policy: Policy) -> None:
    with pytest.raises(EngineUnavailableError, match="rollout.tensor_model_parallel_size=2: the Transformers engine"):
        build_rollout_engine(EngineSpec(name="hf", tensor_parallel_size=2), policy)


def test_a_bfloat16_engine_decodes_from_a_copy_that_every_push_refreshes() -> None:
    policy = load_policy(build_config().model)  # its own: the actor's weights are changed below
    actor = policy.model
    assert factory.hf_engine_copy(EngineSpec(dtype="auto"), actor, sharded=False) is None
    assert factory.hf_engine_copy(EngineSpec(dtype="float32"), actor, sharded=False) is None
    sharded_copy = factory.hf_engine_copy(EngineSpec(dtype="auto"), actor, sharded=True)
    assert sharded_copy is not None and next(sharded_copy.parameters()).dtype == torch.float32

    cfg = EngineSpec(dtype="bfloat16")
    module = factory.hf_engine_copy(cfg, actor, sharded=False)
    assert module is not None and module is not actor
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in module.parameters())
    engine = build_rollout_engine(cfg, policy, module=module)
    assert not factory.samples_from_module(engine, actor)  # so pi_old is recomputed when the ratio needs it

    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.update_weights(actor.named_parameters())
    copies = dict(module.named_parameters())
    for name, p in actor.named_parameters():
        assert torch.equal(copies[name], p.detach().to(torch.bfloat16)), name
    # The probe's view: bf16 rounding alone between the copy and the fp32 actor, well inside the stale threshold.
    prompt, response = [1, 2, 3, 4], [5, 6, 7, 8]
    with torch.no_grad():
        logits = actor(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    actor_lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None])[:, 0]
    gap = (torch.tensor(engine.log_probs_of(prompt, response)) - actor_lp).abs().mean()
    assert 0 < gap < 0.05
