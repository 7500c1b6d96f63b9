"""The sharded format: every rank writes its own shards of model and optimizer, so nothing is gathered onto rank 0.

``optimizer.pt`` and ``rng.pt`` are replaced by ``sharded/`` (``torch.distributed.checkpoint``: each rank writes its
own shards of model and optimizer into rank 0's temp folder) and ``rng_rank{r}.pt`` (each rank's RNG); ``hf/`` is
still written, by rank 0, from full tensors streamed one at a time (``hf_export``). The manifest (``"layout":
"sharded"``) covers the DCP files like any other, and is still written last by rank 0 after every rank has finished.
Loading reshards (``load``): DCP reads the slices this process holds, whatever world size or strategy wrote them, and
in one process without a process group too.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo.infra.atomic import os_error_reason, write_new_file
from dapo.infra.checkpoint.errors import CheckpointError
from dapo.infra.checkpoint.files import relative_files
from dapo.infra.checkpoint.hf_export import HF_SHARD_BYTES, write_hf_export
from dapo.infra.checkpoint.layout import SHARDED_DIR, SHARDED_LAYOUT, rank_rng_name
from dapo.infra.checkpoint.manifest import file_entries
from dapo.infra.checkpoint.rng import capture_rng_state
from dapo.infra.checkpoint.trainer_state import split_trainer_state
from dapo.infra.checkpoint.transaction import begin_save, check_save_args, finish_save, save_failed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from dapo.distributed.world import World


def save_sharded_checkpoint(
    ckpt_root: Path,
    step: int,
    *,
    world: World,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    full_tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]],
    hf_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    trainer_state: dict[str, Any],
    keep_last: int | None = None,
    max_shard_bytes: int = HF_SHARD_BYTES,
    run_config: dict[str, Any] | None = None,
) -> Path:
    """The sharded format: EVERY rank calls this; it returns the checkpoint's path on every rank.

    Rank 0 creates the temp folder (on a file system every rank sees) and tells the others its name; every rank
    writes its own shards of ``model`` and ``optimizer`` into ``sharded/`` with ``torch.distributed.checkpoint``
    (DCP) and its own RNG state into ``rng_rank{r}.pt``; then every rank iterates ``full_tensors()`` (the full
    weights, one at a time, a collective) while rank 0 writes them into ``hf/`` in safetensors files of at most
    ``max_shard_bytes``. After a barrier each rank hashes its share of the files, and rank 0 alone writes the scheduler,
    the trainer state and the manifest (LAST), and renames the folder into place. A failure on any rank is raised as
    the same :class:`CheckpointError` on every rank; a crash anywhere before the rename leaves a temp folder without a
    manifest, which is never a complete checkpoint and is removed by the next save.
    """
    check_save_args(step, keep_last)
    json_state, tensor_state = split_trainer_state(trainer_state)
    begun: tuple[Path, Path | None] | CheckpointError | None = None
    if world.is_main:
        try:
            begun = begin_save(ckpt_root, step)
        except CheckpointError as exc:
            begun = exc
    begun = world.broadcast_object(begun)
    if isinstance(begun, CheckpointError):
        raise begun
    temp_dir, previous = begun

    failure: str | None = None
    current = f"{SHARDED_DIR}/ (the model and optimizer shards of rank {world.rank})"
    try:
        from torch.distributed.checkpoint import FileSystemWriter, save
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
        # A collective: DCP gathers every rank's write result, so an I/O error on one rank is raised on all of them.
        with warnings.catch_warnings():  # DCP warns that no_dist means one process, which is why it is asked for
            warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
            save(
                {"model": model_state, "optim": optimizer_state},
                storage_writer=FileSystemWriter(temp_dir / SHARDED_DIR, sync_files=True),
                no_dist=not world.distributed,
                process_group=world.group,
            )
        current = rank_rng_name(world.rank)
        rng_state = capture_rng_state()
        write_new_file(temp_dir / current, lambda f: torch.save(rng_state, f))
    except Exception as exc:
        failure = f"{os_error_reason(exc)} while writing {current}"
    # Every rank iterates the full tensors, even after a failure: the iteration is a collective (one all-gather per
    # tensor), so a rank that stopped early would leave the others waiting.
    failure = (
        write_hf_export(
            temp_dir / "hf" if world.is_main else None, full_tensors(), hf_model, tokenizer, max_shard_bytes
        )
        or failure
    )
    failures = [f for f in world.all_gather_objects(failure) if f is not None]
    hashed: dict[str, dict[str, Any]] = {}
    if not failures:
        # Each rank hashes its share of what is there now, so rank 0 does not read the whole checkpoint alone.
        rels = relative_files(temp_dir)
        try:
            mine = file_entries(temp_dir, rels[world.rank :: world.world_size])
        except OSError as exc:
            mine = f"{os_error_reason(exc)} while hashing the files of rank {world.rank}"
        for entries in world.all_gather_objects(mine):
            if isinstance(entries, str):
                failures.append(entries)
            else:
                hashed.update(entries)
    outcome: Path | CheckpointError | None = None
    if world.is_main:
        if failures:
            outcome = save_failed(None, "", step, temp_dir, previous, failure=failures[0])
        else:
            try:
                outcome = finish_save(
                    ckpt_root,
                    step,
                    temp_dir,
                    previous,
                    scheduler=scheduler,
                    json_state=json_state,
                    tensor_state=tensor_state,
                    keep_last=keep_last,
                    layout={"layout": SHARDED_LAYOUT, "world_size": world.world_size},
                    hashed=hashed,
                    run_config=run_config,
                )
            except CheckpointError as exc:
                outcome = exc
    outcome = world.broadcast_object(outcome)
    if isinstance(outcome, CheckpointError):
        raise outcome
    return Path(outcome)
