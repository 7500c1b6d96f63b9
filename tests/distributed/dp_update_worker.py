"""Run under torchrun (or alone): one PPO update of a tiny Qwen2 on a fixed batch; rank 0 saves the parameters.

Usage: python dp_update_worker.py OUT.pt [replicated]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for tests.actor.actor_helpers

from dapo.actor.log_probs import compute_log_probs_batch  # noqa: E402
from dapo.actor.optim import build_lr_scheduler, build_optimizer  # noqa: E402
from dapo.actor.update import update_policy  # noqa: E402
from dapo.config import OptimConfig  # noqa: E402
from dapo.distributed.world import World  # noqa: E402
from tests.actor.actor_helpers import actor_config, random_batch, tiny_qwen2  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    world = World.from_env(backend="gloo")
    model = tiny_qwen2(seed=3)
    # 5 groups of 3 with lengths up to 12 tokens: uneven token counts, and an odd number of groups for 2 ranks.
    batch = random_batch(5, 3, seed=11, max_prompt=6, max_response=12, masked=(4,))
    cfg = actor_config(ppo_mini_batch_size=5, ppo_epochs=2, ppo_max_token_len_per_gpu=24,
                       layout=os.environ.get("DP_LAYOUT", "auto"))  # the micro-batch layout under test
    batch = batch.with_old_log_probs([lp + 0.05 for lp in compute_log_probs_batch(model, batch, cfg, 1.0)])
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2, lr_warmup_steps=0))
    scheduler = build_lr_scheduler(optimizer, OptimConfig(lr=1e-2, lr_warmup_steps=0))
    metrics = update_policy(model, optimizer, scheduler, batch, cfg, temperature=1.0, world=world)
    if world.is_main:
        torch.save({"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "metrics": metrics}, out)
    world.barrier()
    world.close()


if __name__ == "__main__":
    main()
