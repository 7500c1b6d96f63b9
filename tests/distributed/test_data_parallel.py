"""Data parallelism: real processes under torchrun (gloo on CPU). An update on 2 ranks, each training on its share of
whole groups, equals the single-process update on the same batch; the share plan is balanced and never splits a group.

One torchrun launch runs every case's 2-rank update (a fresh model each, in one process group); each test computes
its single-process reference here, in the test's own process, where torch is already imported."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.distributed.data_parallel import balanced_group_shares
from dapo.distributed.world import World
from tests.distributed.dp_update_worker import initial_model, launch_command


# The cases of the 2-rank update, all run by one torchrun launch: NAME:STRATEGY:LAYOUT:CHECKPOINTING:ZERO_GROUP:LORA.
CASES = [
    "packed:replicated:packed:0::0",
    "padded:replicated:padded:0::0",
    # LoRA under torchrun with gradient checkpointing on: the adapters replicated on every rank, their gradients
    # summed (the frozen base has none).
    "lora:replicated:shared_prompt:1::1",
    # FSDP2 with gradient checkpointing on. Group 0 has zero advantages, so its samples are skipped and the rank
    # training it needs fewer micro-batches than the other (3 against 5): it pads with zero-weight passes.
    "fsdp2:fsdp2:padded:1:0:0",
    # FSDP2 on a MoE and on a hybrid (Gated DeltaNet + full attention) MoE family (#35's model matrix)
    *(f"fsdp2_{family}:fsdp2:padded:0::0:{family}" for family in ("qwen3_moe", "qwen3_5_moe")),
]
# MoE families: an expert that got few of the batch's tokens has gradient elements near AdamW's eps, whose rounding
# (the ranks sum their micro-batches in another order) its first steps scale to a visible share of lr (measured
# 3.2e-5 for Qwen3-MoE, 1.2e-4 for Qwen3.5-MoE's layer-0 experts, against moves of 2e-2); the gradient norms agree
# to 1e-6 relative.
MOE_PARAM_TOLERANCE = 5e-4


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory where one real 2-rank torchrun launch left every case's update (``NAME.pt``)."""
    out = tmp_path_factory.mktemp("two_ranks")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(launch_command(out, CASES), capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def one_process(**case) -> dict:
    """The same update in one process (this one, no process group), single-threaded as the ranks are."""
    from tests.distributed.dp_update_worker import update

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return update(World(), **case)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_two_ranks_update_equals_one_process(two_ranks: Path, layout: str) -> None:
    assert_same_update(one_process(layout=layout), two_ranks / f"{layout}.pt")


@pytest.mark.slow
def test_two_ranks_lora_update_equals_one_process(two_ranks: Path) -> None:
    one = one_process(layout="shared_prompt", lora=True)
    two = assert_same_update(one, two_ranks / "lora.pt")  # the merged weights
    assert one["adapters"].keys() == two["adapters"].keys() and any(".lora_B." in n for n in two["adapters"])
    for name, p in one["adapters"].items():
        torch.testing.assert_close(two["adapters"][name], p, rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
def test_two_fsdp2_ranks_update_equals_one_process(two_ranks: Path) -> None:
    two = assert_same_update(one_process(layout="padded", zero_group=0), two_ranks / "fsdp2.pt")
    # A rank ran zero-weight micro-batches to match the other's count, and the update is still the same. A mean
    # instead of a sum over ranks would halve actor/grad_norm (compared in assert_same_update) and change clipping.
    assert sum(two["padding"]) > 0
    assert two["loads_back"]  # full model and optimizer states scatter into the shards and gather back unchanged


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"])
def test_two_fsdp2_ranks_update_a_moe_and_a_hybrid_family_as_one_process(two_ranks: Path, family: str) -> None:
    one = one_process(layout="padded", family=family)
    two = assert_same_update(one, two_ranks / f"fsdp2_{family}.pt", family=family, atol=MOE_PARAM_TOLERANCE)
    assert two["metrics"]["actor/grad_norm"] == pytest.approx(one["metrics"]["actor/grad_norm"], rel=1e-5)
    assert two["loads_back"]


def assert_same_update(one: dict, two_file: Path, *, family: str | None = None, atol: float = 1e-5) -> dict:
    two = torch.load(two_file)
    initial = {n: p.detach() for n, p in initial_model(family).named_parameters()}
    moved = 0.0
    for name, p in one["params"].items():
        # AdamW's first steps move a weight by about lr * g / (|g| + eps) whatever |g| is, so the fp32 rounding of a
        # gradient element near eps (the ranks sum their micro-batches in another order) shows as up to ~lr * 1e-3:
        # 1e-5 at lr 1e-2, against moves of ~lr.
        torch.testing.assert_close(two["params"][name], p, rtol=0, atol=atol, msg=name)
        moved = max(moved, float((p - initial[name]).abs().max()))
    assert moved > 1e-3
    assert one["metrics"]["actor/num_optimizer_steps"] == two["metrics"]["actor/num_optimizer_steps"] == 2.0
    for key in ("actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6), key
    return two


def test_single_process_world_is_the_identity() -> None:
    world = World.from_env() if "WORLD_SIZE" not in os.environ else World()
    assert (world.rank, world.world_size, world.is_main, world.distributed) == (0, 1, True, False)
    t = torch.tensor([1.0, 2.0])
    assert world.all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    assert world.all_gather_objects({"a": 1}) == [{"a": 1}] and world.broadcast_object(5) == 5


def test_hand_computed_share_plan() -> None:
    # tokens per group: 10, 3, 7, 7, 1 -> longest first onto the lightest rank: 10->r0, 7->r1, 7->r1 (7<10), 3->r0, 1->r0
    assert balanced_group_shares([10, 3, 7, 7, 1], 2) == [[0, 1, 4], [2, 3]]
    assert balanced_group_shares([5], 3) == [[0], [], []]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 50), max_size=40), st.integers(1, 8))
def test_shares_partition_the_groups_and_balance_tokens(tokens: list[int], world_size: int) -> None:
    shares = balanced_group_shares(tokens, world_size)
    assert len(shares) == world_size
    assert sorted(g for s in shares for g in s) == list(range(len(tokens)))  # every group once, never split
    loads = [sum(tokens[g] for g in s) for s in shares]
    if tokens:  # greedy longest-first: no rank exceeds another by more than the largest group
        assert max(loads) - min(loads) <= max(tokens)
