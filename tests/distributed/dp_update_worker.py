"""Run under torchrun: PPO updates of a tiny Qwen2 on a fixed batch, one per case, all in one launch (one process
group, a fresh model per case); rank 0 saves each case's parameters. The single-process reference calls
:func:`update` in the test's own process.

Usage: python dp_update_worker.py OUT_DIR CASE [CASE ...]   where CASE is NAME:STRATEGY:LAYOUT:CHECKPOINTING:ZERO_GROUP:LORA
with an optional :FAMILY (e.g. ``fsdp2:fsdp2:padded:1:0:0``; an empty ZERO_GROUP is none; FAMILY: a tiny family of
tests/model/families.py instead of the tiny Qwen2); rank 0 writes OUT_DIR/NAME.pt.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.actor.actor_helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))  # for families (tests/model/families.py)

from dapo.actor.log_probs import compute_log_probs_batch, resolve_layout  # noqa: E402
from dapo.actor.mini_batch_plan import sharded_share  # noqa: E402
from dapo.actor.optim import build_lr_scheduler, build_optimizer  # noqa: E402
from dapo.actor.update import update_policy  # noqa: E402
from dapo.config import ModelConfig, OptimConfig  # noqa: E402
from dapo.config.schema import FsdpConfig  # noqa: E402
from dapo.distributed.fsdp import (
    full_model_state,
    full_optimizer_state,
    load_full_model_state,  # noqa: E402
    load_full_optimizer_state,
    shard_actor,
    stream_full_parameters,
)
from dapo.distributed.world import World  # noqa: E402
from dapo.model.lora import adapter_named_parameters, apply_lora, merged_named_parameters  # noqa: E402
from tests.actor.actor_helpers import actor_config, random_batch  # noqa: E402
from tests.harness.models import ACTOR, tiny_qwen2  # noqa: E402
from tests.model.families import build_tiny_model  # noqa: E402


def full_states_load_back(model, optimizer, world: World) -> bool:
    """Gathered full states (the checkpoint format), changed, loaded into the shards and gathered again, come back
    as loaded: what a resume on another world size or strategy relies on."""
    model_state = {k: v + 1.0 for k, v in world.broadcast_object(full_model_state(model)).items()}
    optim_state = world.broadcast_object(full_optimizer_state(model, optimizer))
    for slot in optim_state["state"].values():
        slot["exp_avg"] = slot["exp_avg"] * 2.0
    assert load_full_model_state(model, model_state) == []
    load_full_optimizer_state(model, optimizer, optim_state)
    model_again, optim_again = full_model_state(model), full_optimizer_state(model, optimizer)
    if not world.is_main:
        return True
    return all(torch.equal(model_again[k], v) for k, v in model_state.items()) and all(
        torch.equal(optim_again["state"][i]["exp_avg"], slot["exp_avg"]) for i, slot in optim_state["state"].items()
    )


def tied_weights_load_back(world: World) -> bool:
    """A tied LM head (the embedded model's layout) is left out of the gathered state, as save_pretrained leaves it
    out, and loading that state fills it from the embeddings."""
    model = shard_actor(build_tiny_model("llama3", 5, tie_word_embeddings=True), FsdpConfig(), world)
    state = {k: v + 1.0 for k, v in world.broadcast_object(full_model_state(model)).items()}
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state
    assert load_full_model_state(model, state) == []
    head = dict(stream_full_parameters(model.lm_head))["weight"]
    return bool(torch.equal(head, state["model.embed_tokens.weight"]))


def initial_model(family: str | None = None) -> torch.nn.Module:
    """The model a case updates: the tiny Qwen2, or the tiny ``family`` of tests/model/families.py."""
    if family is None:
        return tiny_qwen2(3, ACTOR)
    from families import build_tiny_model

    return build_tiny_model(family, 3)


def update(
    world: World,
    strategy: str = "replicated",
    layout: str = "auto",
    checkpointing: bool = False,
    zero_group: int | None = None,
    lora: bool = False,
    family: str | None = None,
) -> dict:
    """One PPO update on ``world`` (a single-process World() or torchrun's ranks); what rank 0 saves."""
    model = initial_model(family)
    if lora:  # rank-4 LoRA adapters (PEFT), replicated; B away from its zero start
        torch.manual_seed(4)
        model = apply_lora(model, ModelConfig(lora_rank=4, lora_alpha=8))
        with torch.no_grad():
            for name, p in adapter_named_parameters(model):
                if ".lora_B." in name:
                    p.normal_(0.0, 0.1)
    # 5 groups of 3 with lengths up to 12 tokens: uneven token counts, and an odd number of groups for 2 ranks.
    batch = random_batch(5, 3, seed=11, max_prompt=6, max_response=12, masked=(4,))
    if zero_group is not None:  # that group's samples are skipped: its rank runs fewer micro-batches
        advantages = batch.advantages.clone()
        advantages[3 * zero_group : 3 * zero_group + 3] = 0.0
        batch = dataclasses.replace(batch, advantages=advantages)
    cfg = actor_config(
        ppo_mini_batch_size=5,
        ppo_epochs=2,
        ppo_max_token_len_per_gpu=24,
        layout=layout,  # the micro-batch layout under test
        gradient_checkpointing=checkpointing,
    )
    batch = batch.with_old_log_probs([lp + 0.05 for lp in compute_log_probs_batch(model, batch, cfg, 1.0)])
    padding = []
    if strategy == "fsdp2":
        model = shard_actor(model, FsdpConfig(), world, gradient_checkpointing=checkpointing)
        padding = world.all_gather_objects(
            sharded_share(batch, cfg, world, resolve_layout(cfg.layout, model)).num_padding
        )
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2, lr_warmup_steps=0))
    scheduler = build_lr_scheduler(optimizer, OptimConfig(lr=1e-2, lr_warmup_steps=0))
    metrics = update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0, world=world)
    params = {n: p.detach().clone() for n, p in stream_full_parameters(model)}  # every rank gathers, in order
    adapters = {}
    if lora:  # compared under the base model's names (merged), and the adapters alone
        adapters = {n: p for n, p in params.items() if ".lora_" in n}
        params = {n: p.clone() for n, p in merged_named_parameters(model)}
    loads_back = strategy != "fsdp2" or (
        full_states_load_back(model, optimizer, world) and tied_weights_load_back(world)
    )
    return {"params": params, "adapters": adapters, "metrics": metrics, "padding": padding, "loads_back": loads_back}


def launch_command(out: Path | str, cases: list[str]) -> list[str]:
    """torchrun's command for one 2-rank launch of this worker over ``cases`` (gloo on loopback), leaving each
    case's result in ``out``."""
    from tests.harness.ports import free_port

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(Path(__file__).resolve()),
        str(out),
        *cases,
    ]


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    world = World.from_env(backend="gloo")
    for case in sys.argv[2:]:
        name, strategy, layout, checkpointing, zero_group, lora, *family = case.split(":")
        result = update(
            world,
            strategy,
            layout,
            checkpointing == "1",
            int(zero_group) if zero_group else None,
            lora == "1",
            family[0] if family else None,
        )
        if world.is_main:
            torch.save(result, out / f"{name}.pt")
        world.barrier()
    world.close()


if __name__ == "__main__":
    main()
    # The result is saved and the group closed. Leave without running C++ static destructors: under a loaded
    # machine a rank sometimes aborted there ("terminate called without an active exception", a background thread
    # still joinable at exit), failing a run whose update had already been checked.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
