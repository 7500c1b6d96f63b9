"""The save transaction both formats share: why a crash never leaves a folder that counts as a checkpoint.

Everything is first written into a hidden temp folder next to the final one, every file and folder is fsynced, the
manifest is written LAST, and only then is the temp folder ``os.replace``-d onto ``global_step_{N}`` (one atomic
rename). On any failure the temp folder is removed and the error says which earlier checkpoint is still intact; a
folder left by a killed save has no manifest, is never complete, and the next save removes it. ``scheduler.pt`` and
``trainer_state.pt`` are read back with ``torch.load(weights_only=True)`` at save time, so an unrestorable state fails
on save, not on resume.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from dapo.infra.atomic import fsync_tree, is_temp_name, os_error_reason, replace_directory, write_new_file
from dapo.infra.checkpoint.discovery import complete_checkpoints, find_latest_checkpoint, update_latest_file
from dapo.infra.checkpoint.errors import CheckpointError
from dapo.infra.checkpoint.files import json_bytes, relative_files
from dapo.infra.checkpoint.layout import CONFIG_NAME, MANIFEST_NAME, TEMP_PREFIX, TRASH_PREFIX, checkpoint_dir_name
from dapo.infra.checkpoint.manifest import MANIFEST_FORMAT, file_entries
from dapo.infra.checkpoint.rotation import rotate_checkpoints

logger = logging.getLogger(__package__)  # the package's one logger: its name is what filters and log lines show


def check_save_args(step: int, keep_last: int | None) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint: step must be an int >= 0, got {step!r}")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise ValueError(f"save_checkpoint: keep_last must be None or an int >= 1, got {keep_last!r}")


def begin_save(ckpt_root: Path, step: int) -> tuple[Path, Path | None]:
    """Create the hidden temp folder ``step``'s checkpoint is written into; return it and the newest intact one."""
    ckpt_root = Path(ckpt_root)
    try:
        ckpt_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{os_error_reason(exc)} while creating {ckpt_root} for step {step}") from exc
    _remove_leftovers(ckpt_root)
    previous = find_latest_checkpoint(ckpt_root)
    temp_dir = ckpt_root / f"{TEMP_PREFIX}{checkpoint_dir_name(step)}-{os.getpid()}"
    try:
        temp_dir.mkdir()
    except OSError as exc:
        raise save_failed(exc, "the temp folder", step, temp_dir, previous) from exc
    return temp_dir, previous


def save_failed(
    exc: BaseException | None,
    current: str,
    step: int,
    temp_dir: Path,
    previous: Path | None,
    *,
    failure: str | None = None,
) -> BaseException:
    """Remove the partial folder; the exception to raise (a KeyboardInterrupt / SystemExit passes through as is).

    ``failure``: the "<reason> while <doing what>" of a failure already described (on another rank), instead of
    ``exc`` while writing ``current``."""
    shutil.rmtree(temp_dir, ignore_errors=True)
    if exc is not None and not isinstance(exc, Exception):
        return exc
    failure = failure or f"{os_error_reason(exc)} while writing {current}"
    intact = (
        f"previous checkpoint {previous.name} is intact" if previous is not None else "there is no previous checkpoint"
    )
    return CheckpointError(f"{failure} for step {step}; {intact} (partial folder {temp_dir.name} removed)")


def finish_save(
    ckpt_root: Path,
    step: int,
    temp_dir: Path,
    previous: Path | None,
    *,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    json_state: dict[str, Any],
    tensor_state: dict[str, Any],
    keep_last: int | None,
    layout: dict[str, Any],
    hashed: dict[str, dict[str, Any]] | None = None,
    run_config: dict[str, Any] | None = None,
) -> Path:
    """Write the scheduler and trainer state, then the manifest LAST, fsync and rename the temp folder into place.

    ``hashed``: manifest entries of files other ranks already hashed (a sharded save); the rest are hashed here.
    ``layout``: extra manifest keys saying how model and optimizer are stored (empty: the full format).
    """
    ckpt_root = Path(ckpt_root)
    name = checkpoint_dir_name(step)
    final_dir = ckpt_root / name
    current = "scheduler.pt"
    try:
        if scheduler is not None:
            write_new_file(temp_dir / "scheduler.pt", lambda f: torch.save(scheduler.state_dict(), f))
            _check_weights_only_loadable(temp_dir / "scheduler.pt")
        current = "trainer_state.json"
        write_new_file(temp_dir / "trainer_state.json", lambda f: f.write(json_bytes(json_state)))
        if tensor_state:
            current = "trainer_state.pt"
            write_new_file(temp_dir / "trainer_state.pt", lambda f: torch.save(tensor_state, f))
            _check_weights_only_loadable(temp_dir / "trainer_state.pt")
        if run_config is not None:
            current = CONFIG_NAME
            text = yaml.safe_dump(run_config, sort_keys=False).encode("utf-8")
            write_new_file(temp_dir / CONFIG_NAME, lambda f: f.write(text))
        current = MANIFEST_NAME
        hashed = dict(hashed or {})
        files = {**hashed, **file_entries(temp_dir, [r for r in relative_files(temp_dir) if r not in hashed])}
        manifest = {
            "format": MANIFEST_FORMAT,
            "step": step,
            "created_unix": time.time(),
            **layout,
            "files": dict(sorted(files.items())),
        }
        write_new_file(temp_dir / MANIFEST_NAME, lambda f: f.write(json_bytes(manifest)))
        current = "fsync of the written files"
        fsync_tree(temp_dir)
        current = f"the rename of the temp folder onto {name}"
        if final_dir.exists():
            logger.warning("checkpoint %s already exists; replacing it with the new save", final_dir)
        replace_directory(temp_dir, final_dir)
    except BaseException as exc:
        raise save_failed(exc, current, step, temp_dir, previous) from exc

    complete = complete_checkpoints(ckpt_root)
    update_latest_file(ckpt_root, max(complete) if complete else step)
    if keep_last is not None:
        rotate_checkpoints(ckpt_root, step, keep_last)
    return final_dir


def _remove_leftovers(ckpt_root: Path) -> None:
    """Delete temp/trash entries left behind by a save that was killed (they are never complete)."""
    for entry in ckpt_root.iterdir():
        if not (entry.name.startswith((TEMP_PREFIX, TRASH_PREFIX)) or is_temp_name(entry.name)):
            continue
        logger.warning("removing %s left behind by an interrupted checkpoint save", entry)
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _check_weights_only_loadable(path: Path) -> None:
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(
            f"{path.name} cannot be restored with torch.load(weights_only=True): {exc}. "
            "Keep resume state to tensors, numbers, strings and plain containers."
        ) from exc
