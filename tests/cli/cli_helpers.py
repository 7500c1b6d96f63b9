"""The CLI tests' arguments and checkpoints; the ways of running `dapo` are in :mod:`tests.harness.runners`."""

from __future__ import annotations

from pathlib import Path

# A few-step DAPO run on the embedded tiny model: every stage of Algorithm 1 runs, in seconds.
FAST = [
    "trainer.total_training_steps=2",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=2",
    "rollout.n=4",
    "data.synth.num_train=64",
    "data.synth.num_val=8",
    "rollout.val_kwargs.n=2",
    "trainer.test_freq=2",
    "trainer.num_threads=1",
    "algorithm.filter_groups.on_exhausted=train_on_partial",
]


def save_embedded_checkpoint(ckpt_root: Path, *, lora: bool = False, seed: int = 0) -> Path:
    """A checkpoint of the embedded tiny model as training writes it (``global_step_1`` with ``hf/`` and its
    manifest); ``lora``: a LoRA actor's, whose ``hf/`` holds the adapter and ``hf/merged/`` the merged model."""
    import torch

    from dapo.config import load_config
    from dapo.infra.checkpoint import save_checkpoint
    from dapo.model.loading import load_policy
    from dapo.model.lora import AdapterAndMergedExport, with_lora

    cfg = load_config(None, ["actor_rollout_ref.model.lora_rank=8"] if lora else [])
    torch.manual_seed(seed)
    policy = with_lora(load_policy(cfg.model), cfg.model)
    model = AdapterAndMergedExport(policy.model, policy.tokenizer) if lora else policy.model
    optimizer = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=0.1)
    return save_checkpoint(
        ckpt_root,
        1,
        model=model,
        tokenizer=policy.tokenizer,
        optimizer=optimizer,
        scheduler=None,
        trainer_state={"step": 1},
    )


def flip_middle_byte(path: Path) -> None:
    """Damage ``path`` without changing its size (what only a checksum notices)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
