"""The full format: one process writes the whole model (``hf/``) and optimizer state (``optimizer.pt``).

A replicated actor writes its own state; a sharded (FSDP2) caller gathers the full model and optimizer state onto
rank 0 first (``model_state`` / ``optimizer_state``), so the files are those a replicated actor writes, and loading
hands them to the caller's ``load_weights`` / ``load_optimizer``, which scatter them into the shards. Rank 0 needs CPU
memory for the whole model and optimizer state; the sharded format (``save_sharded``) does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo.infra.atomic import write_new_file
from dapo.infra.checkpoint.rng import capture_rng_state
from dapo.infra.checkpoint.trainer_state import split_trainer_state
from dapo.infra.checkpoint.transaction import begin_save, check_save_args, finish_save, save_failed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    *,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    trainer_state: dict[str, Any],
    keep_last: int | None = None,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    run_config: dict[str, Any] | None = None,
) -> Path:
    """Write ``ckpt_root/global_step_{step}`` atomically and return its path.

    ``trainer_state`` is the trainer's opaque resume state (step, data-loader position, dynamic
    sampling carry-over ...). Values that survive a JSON round trip unchanged go to
    ``trainer_state.json`` (human readable); all others (tensors, tuples, NaN, int-keyed dicts) go to
    ``trainer_state.pt``. ``load_checkpoint`` returns the merged dict, equal to the one saved.

    On any failure (full disk, I/O error, unrestorable state) the temp folder is removed, earlier
    checkpoints are untouched and :class:`CheckpointError` says what failed and which checkpoint is
    still intact. ``keep_last`` (>= 1) deletes older complete checkpoints beyond the newest
    ``keep_last`` (this one included), only after this one is complete; checkpoints with a higher step
    than ``step`` are never deleted.

    ``model_state`` / ``optimizer_state``: the full states to write instead of ``model.state_dict()`` /
    ``optimizer.state_dict()`` (a sharded model's, gathered by the caller; ``model`` then only gives the config).
    ``run_config``: the configuration that made this checkpoint (a YAML-safe dict), saved as ``config.yaml`` in it
    (:func:`checkpoint_config` reads it back).
    """
    check_save_args(step, keep_last)
    json_state, tensor_state = split_trainer_state(trainer_state)
    temp_dir, previous = begin_save(ckpt_root, step)
    current = "hf/ (model weights and config)"
    try:
        if model_state is None:
            model.save_pretrained(temp_dir / "hf", safe_serialization=True)
        else:
            model.save_pretrained(temp_dir / "hf", safe_serialization=True, state_dict=model_state)
        if tokenizer is not None:
            current = "hf/ (tokenizer files)"
            tokenizer.save_pretrained(temp_dir / "hf")
        current = "optimizer.pt"
        optimizer_file_state = optimizer.state_dict() if optimizer_state is None else optimizer_state
        write_new_file(temp_dir / "optimizer.pt", lambda f: torch.save(optimizer_file_state, f))
        current = "rng.pt"
        rng_state = capture_rng_state()
        write_new_file(temp_dir / "rng.pt", lambda f: torch.save(rng_state, f))
    except BaseException as exc:
        raise save_failed(exc, current, step, temp_dir, previous) from exc
    return finish_save(
        ckpt_root,
        step,
        temp_dir,
        previous,
        scheduler=scheduler,
        json_state=json_state,
        tensor_state=tensor_state,
        keep_last=keep_last,
        layout={},
        run_config=run_config,
    )
