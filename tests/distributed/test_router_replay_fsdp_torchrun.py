"""MoE routing replay R3 under actor.strategy=fsdp2 (#35): real `dapo train` on 2 torchrun ranks (gloo on CPU) with a
tiny Qwen3-MoE. Each rank's engine generates its share of the prompts from its own unsharded copy of the actor, which
records the routes on a tape of its own; every rank replays them inside the FSDP2 root, the old-log-prob pass over
the whole batch and the update over its own share, and under activation checkpointing each layer's recompute in the
backward replays its forward's routes. The routing agreement between rollout and actor is 1.0, and the weights after
two steps are the replicated R3 run's (2 ranks, the engine sharing the actor's module, no checkpointing).

Why the weights can tell: two mini-batches a step, so the second trains after an optimizer step and the live router
no longer picks every replayed route (``moe/update_routing_agreement`` < 1, asserted); an update that routed live
anywhere (a rank not replaying its share, checkpointed layers recomputing live routes) trains other experts on those
tokens than the replicated run does (rank 1 routing its update share live: 1.4e-2; a recompute without the replay
context fails torch's checkpoint check outright). The update's agreement is the same number in both runs: an FSDP2
rank's zero-weight padding passes replay uncounted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.distributed.test_train_torchrun import SMALL
from tests.harness.runners import torchrun_warm
from tests.model.families import save_tiny_model

# 4 groups a step in 2 mini-batches of 2 (one group per rank in each): the second mini-batch trains after a step.
ARGS = [
    *SMALL,
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=2",
    "actor.optim.lr=1e-2",  # large enough that the first mini-batch's step moves some of the router's near ties
    "actor.router_replay.mode=R3",
    # FSDP2 runs the padded layout (auto); the replicated run must too, its auto picks shared_prompt under replay,
    # where a shared prompt counts once in moe/update_routing_agreement
    "actor.layout=padded",
    "algorithm.filter_groups.enable=false",  # a random model's groups are all wrong: train on them anyway
    "trainer.total_training_steps=2",
    "trainer.save_freq=2",
    "trainer.progress=false",
]
# Float rounding between the strategies (FSDP2 reduce-scatters the gradients, replicated all-reduces them) after two
# AdamW steps at lr 1e-2; a token routed to other experts moves its experts' weights by ~lr.
WEIGHT_TOLERANCE = 1e-4


def trained_with_replay(run_root: Path, folder: Path, strategy: str, *extra: str) -> tuple[list[dict], dict]:
    """Two steps of :data:`ARGS` (R3 unless ``extra`` says otherwise) on the model in ``folder``, 2 torchrun ranks:
    the metrics records and the weights after step 2 (also scripts/model_matrix.py's R3 x FSDP2 measurement)."""
    name = "-".join([strategy, *[e.split("=")[0].rsplit(".", 1)[-1] for e in extra]])
    args = [*ARGS, f"model.path={folder}", f"actor.strategy={strategy}", f"trainer.experiment_name={name}", *extra]
    run = torchrun_warm(args, run_root)
    assert run.returncode == 0, run.stderr[-4000:]
    records = [json.loads(line) for line in (run_root / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["actor/num_optimizer_steps"] == 2.0 for r in records)  # two mini-batches a step
    return records, loaded_weights(run_root / name / "checkpoints" / "global_step_2" / "hf")


def loaded_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The model of a Hugging Face folder, as loaded (the FSDP2 export keeps the experts fused as the module holds
    them, save_pretrained splits them per expert: one model either way)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


def largest_weight_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].shape == b[key].shape, key  # full tensors, not one rank's shard
    return max(float((a[key] - b[key]).abs().max()) for key in a)


@pytest.mark.slow
def test_r3_under_fsdp2_agrees_with_the_rollout_and_trains_the_replicated_weights(tmp_path: Path) -> None:
    folder = save_tiny_model("qwen3_moe", tmp_path / "model", eos_token_ids=range(2, 601, 6))
    replicated, a = trained_with_replay(tmp_path, folder, "replicated")
    # under activation checkpointing: each layer's recompute in the backward replays its forward's routes
    sharded, b = trained_with_replay(tmp_path, folder, "fsdp2", "actor.gradient_checkpointing=true")
    for record in sharded:
        assert record["moe/routing_agreement"] == 1.0  # the copies' routes, on every rank's samples
        assert record["moe/log_prob_gap/replayed_max"] <= record["moe/log_prob_gap/live_max"]
    # the update's live router left some replayed routes (summed over both ranks' shares): replay changed the update
    assert min(r["moe/update_routing_agreement"] for r in sharded) < 1.0
    for one, two in zip(replicated, sharded, strict=True):
        assert one["moe/update_routing_agreement"] == two["moe/update_routing_agreement"]
    assert any(".mlp.gate." in k for k in a)
    assert largest_weight_gap(b, loaded_weights(folder)) > 100 * WEIGHT_TOLERANCE  # it trained
    assert largest_weight_gap(a, b) <= WEIGHT_TOLERANCE
