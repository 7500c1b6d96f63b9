"""Atomic, resumable training checkpoints.

Layout written under ``ckpt_root`` (normally ``run_dir/checkpoints``)::

    ckpt_root/
      latest_checkpointed_iteration.txt   # step of the newest complete checkpoint (verl convention)
      global_step_{N}/
        hf/                  # model.save_pretrained (safetensors) + tokenizer.save_pretrained:
                             # loadable by AutoModelForCausalLM.from_pretrained and by vLLM
        optimizer.pt         # optimizer.state_dict()
        scheduler.pt         # scheduler.state_dict() (absent when there is no scheduler)
        rng.pt               # python `random`, numpy, torch CPU and (when available) CUDA RNG states
        trainer_state.json   # the JSON-exact part of the trainer's opaque state dict
        trainer_state.pt     # the rest of it (tensors, tuples, int-keyed dicts ...), absent when empty
        config.yaml          # the configuration of the run that made this checkpoint (absent when not given)
        manifest.json        # written LAST: every other file with its size in bytes and its SHA-256

Why it is crash safe: everything is first written into a hidden temp folder next to the final one,
every file and folder is fsynced, and only then is the temp folder ``os.replace``-d onto
``global_step_{N}`` (one atomic rename). A checkpoint counts as *complete* only when its manifest is
present and every file it lists has the recorded size, so a folder left by a crash, a full disk or a
half-copied directory is never picked for resuming. A checkpoint *verifies* when, in addition, every file
has its recorded SHA-256: ``find_latest_checkpoint`` returns the newest checkpoint that verifies (logging
each newer one it skips, and why) and ``load_checkpoint`` refuses one that does not, so a file that kept
its size but not its content (bit rot, a stray write) never reaches ``json.loads`` or safetensors.
Hashing reads every file once more (about 1 GB/s), a cost paid at save and at resume, not per step.
Manifests written before checksums were recorded are verified by size only.

Resume equality: ``load_checkpoint`` restores parameters, optimizer and scheduler state and every RNG
stream exactly, so continuing training after a load gives bit-identical parameters to a run that was
never interrupted (on CPU; CUDA kernels may add their own non-determinism).

Sharded models (FSDP2) have two formats (``trainer.checkpoint_format``; docs/checkpoints.md):

- full (:func:`save_checkpoint`): the caller gathers the full model and optimizer state onto rank 0 (``model_state``
  / ``optimizer_state``, in the formats above), so the files are those a replicated actor writes; loading reads the
  same full files on every rank and hands them to the caller's ``load_weights`` / ``load_optimizer``, which scatter
  them into the shards. Rank 0 needs CPU memory for the whole model and optimizer state.
- sharded (:func:`save_sharded_checkpoint`, every rank calls it): ``optimizer.pt`` and ``rng.pt`` are replaced by
  ``sharded/`` (``torch.distributed.checkpoint``: each rank writes its own shards of model and optimizer into rank
  0's temp folder, so nothing is gathered) and ``rng_rank{r}.pt`` (each rank's RNG); ``hf/`` is still written, by rank
  0, from full tensors streamed one at a time. The manifest (``"layout": "sharded"``) covers the DCP files like any
  other, and is still written last by rank 0 after every rank has finished. Loading reshards: DCP reads the slices
  this process holds, whatever world size or strategy wrote them, and in one process without a process group too.

Security: every ``.pt`` file is read with ``torch.load(weights_only=True)``, so loading a checkpoint
never runs pickled code. ``save_checkpoint`` checks at save time that ``scheduler.pt`` and
``trainer_state.pt`` can be read back that way, so an unrestorable state fails on save, not on resume.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from dapo.infra.atomic import (
    atomic_write,
    fsync_tree,
    is_temp_name,
    os_error_reason,
    replace_directory,
    write_new_file,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from dapo.distributed.world import World

__all__ = [
    "LATEST_FILE_NAME",
    "SHARDED_LAYOUT",
    "MANIFEST_NAME",
    "CheckpointError",
    "checkpoint_config",
    "checkpoint_dir_name",
    "checkpoint_folder_problem",
    "checkpoint_problems",
    "find_latest_checkpoint",
    "is_complete_checkpoint",
    "load_checkpoint",
    "rotate_checkpoints",
    "save_checkpoint",
    "save_sharded_checkpoint",
]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
CONFIG_NAME = "config.yaml"  # the run's configuration when the checkpoint was made
LATEST_FILE_NAME = "latest_checkpointed_iteration.txt"
MANIFEST_FORMAT = "dapo-checkpoint/1"
SHARDED_LAYOUT = "sharded"  # the manifest's "layout" in the sharded format (absent: the full format)
SHARDED_DIR = "sharded"  # the DCP folder of a sharded checkpoint
HF_SHARD_BYTES = 2 * 1024**3  # the most tensor bytes rank 0 holds while streaming the hf/ export of a sharded save

_STEP_DIR_RE = re.compile(r"^global_step_(\d+)$")
_TEMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".old-"


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded; the message says what happened and what is intact."""


def checkpoint_dir_name(step: int) -> str:
    """Folder name of the checkpoint taken after optimizer step ``step``."""
    return f"global_step_{step}"


# --------------------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------------------


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
    _check_save_args(step, keep_last)
    json_state, tensor_state = _split_trainer_state(trainer_state)
    temp_dir, previous = _begin_save(ckpt_root, step)
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
        rng_state = _capture_rng_state()
        write_new_file(temp_dir / "rng.pt", lambda f: torch.save(rng_state, f))
    except BaseException as exc:
        raise _save_failed(exc, current, step, temp_dir, previous) from exc
    return _finish_save(ckpt_root, step, temp_dir, previous, scheduler=scheduler, json_state=json_state,
                        tensor_state=tensor_state, keep_last=keep_last, layout={}, run_config=run_config)


def _check_save_args(step: int, keep_last: int | None) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint: step must be an int >= 0, got {step!r}")
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
        raise ValueError(f"save_checkpoint: keep_last must be None or an int >= 1, got {keep_last!r}")


def _begin_save(ckpt_root: Path, step: int) -> tuple[Path, Path | None]:
    """Create the hidden temp folder ``step``'s checkpoint is written into; return it and the newest intact one."""
    ckpt_root = Path(ckpt_root)
    try:
        ckpt_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{os_error_reason(exc)} while creating {ckpt_root} for step {step}") from exc
    _remove_leftovers(ckpt_root)
    previous = find_latest_checkpoint(ckpt_root)
    temp_dir = ckpt_root / f"{_TEMP_PREFIX}{checkpoint_dir_name(step)}-{os.getpid()}"
    try:
        temp_dir.mkdir()
    except OSError as exc:
        raise _save_failed(exc, "the temp folder", step, temp_dir, previous) from exc
    return temp_dir, previous


def _save_failed(exc: BaseException | None, current: str, step: int, temp_dir: Path, previous: Path | None, *,
                 failure: str | None = None) -> BaseException:
    """Remove the partial folder; the exception to raise (a KeyboardInterrupt / SystemExit passes through as is).

    ``failure``: the "<reason> while <doing what>" of a failure already described (on another rank), instead of
    ``exc`` while writing ``current``."""
    shutil.rmtree(temp_dir, ignore_errors=True)
    if exc is not None and not isinstance(exc, Exception):
        return exc
    failure = failure or f"{os_error_reason(exc)} while writing {current}"
    intact = (f"previous checkpoint {previous.name} is intact" if previous is not None
              else "there is no previous checkpoint")
    return CheckpointError(f"{failure} for step {step}; {intact} (partial folder {temp_dir.name} removed)")


def _file_entries(root: Path, rels: list[str]) -> dict[str, dict[str, Any]]:
    """The manifest entry (size in bytes, SHA-256) of each of ``rels`` under ``root``."""
    return {rel: {"size": (root / rel).stat().st_size, "sha256": _sha256(root / rel)} for rel in rels}


def _finish_save(ckpt_root: Path, step: int, temp_dir: Path, previous: Path | None, *,
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None, json_state: dict[str, Any],
                 tensor_state: dict[str, Any], keep_last: int | None, layout: dict[str, Any],
                 hashed: dict[str, dict[str, Any]] | None = None, run_config: dict[str, Any] | None = None) -> Path:
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
        write_new_file(temp_dir / "trainer_state.json", lambda f: f.write(_json_bytes(json_state)))
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
        files = {**hashed, **_file_entries(temp_dir, [r for r in _relative_files(temp_dir) if r not in hashed])}
        manifest = {"format": MANIFEST_FORMAT, "step": step, "created_unix": time.time(), **layout,
                    "files": dict(sorted(files.items()))}
        write_new_file(temp_dir / MANIFEST_NAME, lambda f: f.write(_json_bytes(manifest)))
        current = "fsync of the written files"
        fsync_tree(temp_dir)
        current = f"the rename of the temp folder onto {name}"
        if final_dir.exists():
            logger.warning("checkpoint %s already exists; replacing it with the new save", final_dir)
        replace_directory(temp_dir, final_dir)
    except BaseException as exc:
        raise _save_failed(exc, current, step, temp_dir, previous) from exc

    complete = _complete_checkpoints(ckpt_root)
    _update_latest_file(ckpt_root, max(complete) if complete else step)
    if keep_last is not None:
        rotate_checkpoints(ckpt_root, step, keep_last)
    return final_dir


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
    _check_save_args(step, keep_last)
    json_state, tensor_state = _split_trainer_state(trainer_state)
    begun: tuple[Path, Path | None] | CheckpointError | None = None
    if world.is_main:
        try:
            begun = _begin_save(ckpt_root, step)
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
            save({"model": model_state, "optim": optimizer_state},
                 storage_writer=FileSystemWriter(temp_dir / SHARDED_DIR, sync_files=True),
                 no_dist=not world.distributed, process_group=world.group)
        current = _rank_rng_name(world.rank)
        rng_state = _capture_rng_state()
        write_new_file(temp_dir / current, lambda f: torch.save(rng_state, f))
    except Exception as exc:
        failure = f"{os_error_reason(exc)} while writing {current}"
    # Every rank iterates the full tensors, even after a failure: the iteration is a collective (one all-gather per
    # tensor), so a rank that stopped early would leave the others waiting.
    failure = _write_hf_export(temp_dir / "hf" if world.is_main else None, full_tensors(), hf_model, tokenizer,
                               max_shard_bytes) or failure
    failures = [f for f in world.all_gather_objects(failure) if f is not None]
    hashed: dict[str, dict[str, Any]] = {}
    if not failures:
        # Each rank hashes its share of what is there now, so rank 0 does not read the whole checkpoint alone.
        rels = _relative_files(temp_dir)
        try:
            mine = _file_entries(temp_dir, rels[world.rank::world.world_size])
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
            outcome = _save_failed(None, "", step, temp_dir, previous, failure=failures[0])
        else:
            try:
                outcome = _finish_save(ckpt_root, step, temp_dir, previous, scheduler=scheduler,
                                       json_state=json_state, tensor_state=tensor_state, keep_last=keep_last,
                                       layout={"layout": SHARDED_LAYOUT, "world_size": world.world_size},
                                       hashed=hashed, run_config=run_config)
            except CheckpointError as exc:
                outcome = exc
    outcome = world.broadcast_object(outcome)
    if isinstance(outcome, CheckpointError):
        raise outcome
    return Path(outcome)


def _write_hf_export(folder: Path | None, tensors: Iterator[tuple[str, torch.Tensor]], hf_model: PreTrainedModel,
                     tokenizer: PreTrainedTokenizerBase | None, max_shard_bytes: int) -> str | None:
    """Write ``tensors`` (name, full tensor) as a Hugging Face folder, holding at most one shard's worth at a time.

    ``folder`` None (not rank 0): only drain the iterator. Returns None, or why the export failed; the iterator is
    always drained to its end. The files are those ``save_pretrained`` writes: ``model.safetensors`` (or
    ``model-0000k-of-0000N.safetensors`` plus ``model.safetensors.index.json``), ``config.json``,
    ``generation_config.json`` and the tokenizer's files.
    """
    from safetensors.torch import save as safetensors_bytes

    failure: str | None = None
    written: list[tuple[str, list[str]]] = []  # (temp shard file name, its tensor names)
    bucket: dict[str, torch.Tensor] = {}
    bucket_bytes = 0
    total_bytes = 0

    def flush() -> None:
        nonlocal bucket, bucket_bytes
        shard = f"shard-{len(written):05d}.safetensors"
        data = safetensors_bytes(bucket, metadata={"format": "pt"})
        write_new_file(folder / shard, lambda f: f.write(data))
        written.append((shard, list(bucket)))
        bucket, bucket_bytes = {}, 0

    try:
        for name, tensor in tensors:
            if folder is None or failure is not None:
                continue
            try:
                if not bucket and not written:
                    folder.mkdir()
                tensor = tensor.detach().to("cpu", copy=True).contiguous()  # a copy: the gathered one can be freed
                nbytes = tensor.numel() * tensor.element_size()
                if bucket and bucket_bytes + nbytes > max_shard_bytes:
                    flush()
                bucket[name] = tensor
                bucket_bytes += nbytes
                total_bytes += nbytes
            except Exception as exc:
                failure = f"{os_error_reason(exc)} while writing hf/ (model weights)"
    except Exception as exc:  # the gathering itself failed (on every rank alike: it is a collective)
        return f"{os_error_reason(exc)} while gathering the full weights for hf/"
    if folder is None or failure is not None:
        return failure
    current = "hf/ (model weights)"
    try:
        if not written and not bucket:
            raise ValueError("the model has no tensors to export")
        if bucket:
            flush()
        count = len(written)
        final_names = (["model.safetensors"] if count == 1
                       else [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)])
        for (shard, _), final in zip(written, final_names, strict=True):
            os.replace(folder / shard, folder / final)
        if count > 1:
            index = {"metadata": {"total_size": total_bytes},
                     "weight_map": {n: final for (_, names), final in zip(written, final_names, strict=True)
                                    for n in names}}
            write_new_file(folder / "model.safetensors.index.json", lambda f: f.write(_json_bytes(index)))
        current = "hf/ (config)"
        config = copy.deepcopy(hf_model.config)
        config.architectures = [type(hf_model).__name__]  # as save_pretrained records it
        config.save_pretrained(folder)
        generation_config = getattr(hf_model, "generation_config", None)
        if generation_config is not None and hf_model.can_generate():
            generation_config.save_pretrained(folder)
        if tokenizer is not None:
            current = "hf/ (tokenizer files)"
            tokenizer.save_pretrained(folder)
    except Exception as exc:
        return f"{os_error_reason(exc)} while writing {current}"
    return None


def _split_trainer_state(trainer_state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the trainer state into a JSON-exact part and a torch.save part (by top-level key)."""
    if not isinstance(trainer_state, dict):
        raise TypeError(f"save_checkpoint: trainer_state must be a dict, got {type(trainer_state).__name__}")
    json_part: dict[str, Any] = {}
    tensor_part: dict[str, Any] = {}
    for key, value in trainer_state.items():
        if not isinstance(key, str):
            raise TypeError(f"save_checkpoint: trainer_state keys must be str, got {key!r} ({type(key).__name__})")
        (json_part if _json_round_trips(value) else tensor_part)[key] = value
    return json_part, tensor_part


def _json_round_trips(value: Any) -> bool:
    """True when ``json.loads(json.dumps(value)) == value`` with the same types (strict, no NaN)."""
    try:
        restored = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return False
    return _same_json_value(value, restored)


def _same_json_value(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode("utf-8")


def _rank_rng_name(rank: int) -> str:
    """A sharded checkpoint's RNG file of ``rank``: every rank keeps its own streams (a CUDA RNG is per device)."""
    return f"rng_rank{rank}.pt"


def _capture_rng_state() -> dict[str, Any]:
    """Every RNG stream training may draw from, in a form ``torch.load(weights_only=True)`` accepts."""
    state: dict[str, Any] = {"python": random.getstate(), "torch_cpu": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with pandas, a hard dependency
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        keys_tensor = torch.from_numpy(np.asarray(keys, dtype=np.int64))  # uint32 -> int64: a weights_only type
        state["numpy"] = (kind, keys_tensor, int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng_state(state: dict[str, Any], where: Path) -> None:
    random.setstate(_as_tuples(state["python"]))
    torch.set_rng_state(state["torch_cpu"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "torch_cuda" in state:
        if not torch.cuda.is_available():
            logger.warning("%s holds CUDA RNG states but CUDA is not available here; CUDA RNG not restored", where)
        elif len(state["torch_cuda"]) != torch.cuda.device_count():
            logger.warning(
                "%s holds CUDA RNG states for %d devices but %d are visible; CUDA RNG not restored",
                where,
                len(state["torch_cuda"]),
                torch.cuda.device_count(),
            )
        else:
            torch.cuda.set_rng_state_all(state["torch_cuda"])


def _as_tuples(value: Any) -> Any:
    """``random.setstate`` needs nested tuples; torch.load may hand back lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    return value


def _check_weights_only_loadable(path: Path) -> None:
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(
            f"{path.name} cannot be restored with torch.load(weights_only=True): {exc}. "
            "Keep resume state to tensors, numbers, strings and plain containers."
        ) from exc


def _files_under(root: Path) -> Iterator[Path]:
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            yield Path(dirpath) / filename


def _relative_files(root: Path) -> list[str]:
    return sorted(path.relative_to(root).as_posix() for path in _files_under(root))


def _remove_leftovers(ckpt_root: Path) -> None:
    """Delete temp/trash entries left behind by a save that was killed (they are never complete)."""
    for entry in ckpt_root.iterdir():
        if not (entry.name.startswith((_TEMP_PREFIX, _TRASH_PREFIX)) or is_temp_name(entry.name)):
            continue
        logger.warning("removing %s left behind by an interrupted checkpoint save", entry)
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _update_latest_file(ckpt_root: Path, step: int) -> None:
    """Atomically point ``latest_checkpointed_iteration.txt`` at ``step`` (best effort: the scan is authoritative)."""
    target = ckpt_root / LATEST_FILE_NAME
    try:
        atomic_write(target, f"{step}\n")
    except OSError as exc:
        logger.warning(
            "checkpoint global_step_%d is complete but %s could not be updated (%s); "
            "find_latest_checkpoint scans the folders and still finds it",
            step,
            target,
            os_error_reason(exc),
        )


def rotate_checkpoints(ckpt_root: Path, new_step: int, keep_last: int) -> list[Path]:
    """Delete checkpoints older than ``new_step`` so that the newest ``keep_last`` good ones remain; return the deleted.

    The checkpoint of ``new_step`` (just written and hashed) counts as one of the ``keep_last``. Older complete
    checkpoints are verified (checksums) newest first, until ``keep_last - 1`` good ones are found: a checkpoint that
    fails to verify is never counted, so it never takes the place of a good one. Good checkpoints beyond those, and
    failed ones older than the oldest kept checkpoint, are deleted; a failed one newer than that is left in place (and
    logged) so it can be inspected, and so is every failed one while fewer good ones than that exist. Checkpoints with a higher step than ``new_step`` are never deleted. Verifying
    reads the kept checkpoints once more per save (about 1 GB/s), the price of never keeping a corrupt one instead of
    a good one.
    """
    ckpt_root = Path(ckpt_root)
    complete = _complete_checkpoints(ckpt_root)
    keep_older = keep_last - 1
    kept: list[int] = []
    failed: list[int] = []
    doomed: list[int] = []
    for step in sorted((s for s in complete if s < new_step), reverse=True):
        if len(kept) >= keep_older:
            doomed.append(step)
            continue
        problem = _manifest_problem(complete[step], verify=True)
        if problem is None:
            kept.append(step)
        else:
            logger.warning("checkpoint %s does not verify (%s): not counted among the %d kept", complete[step],
                           problem, keep_last)
            failed.append(step)
    if len(kept) == keep_older:  # the quota of good ones is full: a failed one older than all of them is no use
        oldest_kept = min(kept, default=new_step)
        doomed += [s for s in failed if s < oldest_kept]
    deleted = []
    for step in sorted(doomed):
        logger.info("keep_last=%d: deleting old checkpoint %s", keep_last, complete[step])
        try:
            shutil.rmtree(complete[step])
            deleted.append(complete[step])
        except OSError as exc:
            logger.warning("could not delete old checkpoint %s: %s", complete[step], exc)
    newer = sorted(s for s in complete if s > new_step)
    if newer:
        logger.warning(
            "checkpoints %s are newer than the one just saved (step %d); find_latest_checkpoint will prefer them",
            [complete[s].name for s in newer],
            new_step,
        )
    return deleted


# --------------------------------------------------------------------------------------------------
# Finding and validating
# --------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _manifest_problem(path: Path, *, verify: bool = False, within: str | None = None) -> str | None:
    """None when ``path`` is a complete checkpoint (and, with ``verify``, every checksum matches), else why not.

    ``within``: a folder of the checkpoint (``hf``, ``hf/merged``) whose files alone are checked, where a file the
    manifest does not list is a problem too (what loads a model from that folder would read it)."""
    if not path.is_dir():
        return "not a folder"
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        return f"no {MANIFEST_NAME} (the save never finished)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST_NAME}: {exc}"
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return f"{MANIFEST_NAME} is not a {MANIFEST_FORMAT} manifest"
    match = _STEP_DIR_RE.match(path.name)
    if match and manifest.get("step") != int(match.group(1)):
        return f"{MANIFEST_NAME} says step {manifest.get('step')!r} but the folder is {path.name}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST_NAME} lists no files"
    if within is not None:
        files = {rel: meta for rel, meta in files.items() if rel.startswith(f"{within}/")}
        on_disk = (f"{within}/{rel}" for rel in _relative_files(path / within))
        unlisted = sorted(rel for rel in on_disk if rel not in files)
        if unlisted:
            return f"{unlisted[0]} is not in its {MANIFEST_NAME} (it was added after the save)"
    for rel, meta in files.items():
        file = path / rel
        if not file.is_file():
            return f"{rel} is missing"
        size = file.stat().st_size
        if not isinstance(meta, dict) or size != meta.get("size"):
            return f"{rel} has {size} bytes, the manifest says {meta.get('size') if isinstance(meta, dict) else meta!r}"
    if verify:
        for rel, meta in files.items():
            expected = meta.get("sha256")
            if expected is not None and _sha256(path / rel) != expected:
                return f"{rel} does not match its checksum in {MANIFEST_NAME} (its content changed after the save)"
    return None


def checkpoint_problems(ckpt_root: Path) -> dict[Path, str]:
    """Every ``global_step_N`` folder under ``ckpt_root`` that does not verify, with the reason."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return {}
    problems = {}
    for entry in sorted(ckpt_root.iterdir()):
        if _STEP_DIR_RE.match(entry.name):
            problem = _manifest_problem(entry, verify=True)
            if problem is not None:
                problems[entry] = problem
    return problems


def checkpoint_folder_problem(folder: Path) -> tuple[Path, str] | None:
    """Whether a model folder inside a checkpoint (``global_step_N/hf``, ``hf/merged``) holds the files that save
    wrote: None when ``folder`` is in no dapo checkpoint (a plain Hugging Face folder) or every file under it matches
    the manifest (size and SHA-256, the check a resume makes) and none was added; else the checkpoint and why not.

    The checkpoint is the nearest enclosing folder with a dapo ``manifest.json`` (or a ``global_step_N`` folder with
    any ``manifest.json``, which is then checked as a resume would). Hashing reads the folder once (about 1 GB/s)."""
    folder = Path(folder).resolve()
    for ckpt in (folder, *folder.parents):
        manifest_path = ckpt / MANIFEST_NAME
        if not manifest_path.is_file():
            continue
        if not _STEP_DIR_RE.match(ckpt.name):
            try:
                manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # another tool's file of that name
            if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
                continue
        within = folder.relative_to(ckpt).as_posix()
        problem = _manifest_problem(ckpt, verify=True, within=None if within == "." else within)
        return None if problem is None else (ckpt, problem)
    return None


def checkpoint_config(path: Path) -> dict[str, Any] | None:
    """The configuration saved with the checkpoint at ``path`` (its ``config.yaml``), or None: a checkpoint written
    before configurations were saved with checkpoints, or without one, or one whose file is not a YAML mapping."""
    try:
        saved = yaml.safe_load((Path(path) / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return saved if isinstance(saved, dict) else None


def is_complete_checkpoint(path: Path) -> bool:
    """True when ``path`` has a valid manifest and every listed file has its recorded size."""
    return _manifest_problem(Path(path)) is None


def _complete_checkpoints(ckpt_root: Path, *, log_skipped: bool = False) -> dict[int, Path]:
    found: dict[int, Path] = {}
    if not ckpt_root.is_dir():
        return found
    for entry in sorted(ckpt_root.iterdir()):
        if not entry.is_dir():
            continue
        if entry.name.startswith((_TEMP_PREFIX, _TRASH_PREFIX)):
            if log_skipped:
                logger.warning("skipping %s: partial folder of an interrupted checkpoint save", entry)
            continue
        match = _STEP_DIR_RE.match(entry.name)
        if not match:
            continue
        problem = _manifest_problem(entry)
        if problem is not None:
            if log_skipped:
                logger.warning("skipping incomplete checkpoint %s: %s", entry, problem)
            continue
        found[int(match.group(1))] = entry
    return found


def find_latest_checkpoint(ckpt_root: Path, *, verify: bool = True) -> Path | None:
    """The checkpoint with the highest step under ``ckpt_root`` that verifies (``verify=False``: that is complete).

    Temp folders and checkpoints whose manifest is missing or does not match the files (sizes, checksums) are
    skipped, each one logged as a warning naming it and the reason.
    """
    complete = _complete_checkpoints(Path(ckpt_root), log_skipped=True)
    for step in sorted(complete, reverse=True):
        problem = _manifest_problem(complete[step], verify=True) if verify else None
        if problem is None:
            return complete[step]
        logger.warning("skipping checkpoint %s: %s; falling back to an older one", complete[step], problem)
    return None


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_checkpoint(
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    load_weights: Callable[[dict[str, torch.Tensor]], list[str]] | None = None,
    load_optimizer: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Restore model weights, optimizer, scheduler and RNG states from ``path``; return the trainer state.

    ``optimizer``/``scheduler`` may be None to restore weights only (e.g. for evaluation). Raises
    :class:`CheckpointError` when ``path`` is not a complete checkpoint or does not fit the objects.
    ``load_weights`` (full state dict -> the keys it could not fill) and ``load_optimizer`` (full optimizer state)
    replace ``model.load_state_dict`` / ``optimizer.load_state_dict`` for a model they cannot load (sharded); they
    apply to the full format only. A sharded checkpoint loads through DCP into any model (FSDP2 shards or whole
    tensors), and each rank restores its own RNG file when the checkpoint has one for its rank, else rank 0's.
    """
    path = Path(path)
    problem = _manifest_problem(path, verify=True)
    if problem is not None:
        raise CheckpointError(f"cannot load {path}: not a complete checkpoint ({problem})")

    sharded = _read_manifest(path).get("layout") == SHARDED_LAYOUT
    rng_file = path / "rng.pt"
    if sharded:
        _load_sharded_state(path / SHARDED_DIR, model, optimizer)
        rank = _process_rank()
        # The same world size continues every rank's own streams (exact resume); another one takes rank 0's, as a
        # full checkpoint hands rank 0's to every rank.
        rng_file = path / _rank_rng_name(rank if (path / _rank_rng_name(rank)).is_file() else 0)
    else:
        _load_model_weights(path / "hf", model, load_weights)
    if optimizer is not None and not sharded:
        optimizer_state = _torch_load(path / "optimizer.pt")
        try:
            (optimizer.load_state_dict if load_optimizer is None else load_optimizer)(optimizer_state)
        except (KeyError, ValueError) as exc:
            if load_optimizer is None:
                raise
            raise CheckpointError(f"cannot load {path / 'optimizer.pt'} into the sharded optimizer: {exc}") from exc
    if scheduler is not None:
        scheduler_file = path / "scheduler.pt"
        if not scheduler_file.is_file():
            raise CheckpointError(f"cannot load {path}: a scheduler was given but the checkpoint has no scheduler.pt")
        scheduler.load_state_dict(_torch_load(scheduler_file))

    try:
        trainer_state: dict[str, Any] = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path / 'trainer_state.json'}: {exc}") from exc
    if (path / "trainer_state.pt").is_file():
        trainer_state.update(_torch_load(path / "trainer_state.pt"))
    _restore_rng_state(_torch_load(rng_file), rng_file)  # last: nothing above may draw from it
    return trainer_state


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a checkpoint that :func:`_manifest_problem` already accepted."""
    return json.loads((path / MANIFEST_NAME).read_text(encoding="utf-8"))


def _process_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _shard_group(model: torch.nn.Module) -> Any:
    """The process group ``model``'s shards are spread over (the trainer ranks' own when other ranks of the job serve
    the rollout); None for a replica (DCP then uses the job's default group)."""
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if isinstance(param, DTensor):
            return param.device_mesh.get_group()
    return None


def _load_sharded_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Load a DCP folder into ``model`` (and ``optimizer``), on any world size and either strategy.

    ``get_state_dict`` describes what this process holds (its FSDP2 shards as DTensors, or a replica's whole
    tensors), and DCP reads exactly those pieces from whichever rank files hold them: resharding on load. Without a
    process group (one process) DCP reads in ``no_dist`` mode, so no group is ever created for it.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                         set_model_state_dict, set_state_dict)

    no_dist = not (dist.is_available() and dist.is_initialized())
    try:
        if optimizer is None:
            state = {"model": get_model_state_dict(model)}
        else:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            state = {"model": model_state, "optim": optimizer_state}
        with warnings.catch_warnings():  # DCP warns that no_dist means one process, which is why it is asked for
            warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
            load(state, storage_reader=FileSystemReader(folder), no_dist=no_dist, process_group=_shard_group(model))
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    except Exception as exc:  # CheckpointException (a key or shape the files lack), or a read error
        raise CheckpointError(f"cannot load the sharded state in {folder} into this model: "
                              f"{type(exc).__name__}: {str(exc)[:500]} (was it saved from a different "
                              "architecture?)") from exc


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc


def _load_model_weights(hf_dir: Path, model: torch.nn.Module,
                        load_weights: Callable[[dict[str, torch.Tensor]], list[str]] | None = None) -> None:
    """Copy the safetensors weights in ``hf_dir`` into ``model`` in place (any device / dtype).

    ``save_pretrained`` omits tied parameters (e.g. ``lm_head.weight`` tied to the embeddings); a
    missing key is accepted only when that parameter shares storage with one that was loaded.
    ``load_weights`` loads the full state instead (a sharded model) and returns the keys it could not fill.
    """
    from safetensors.torch import load_file

    shards = sorted(hf_dir.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"cannot load {hf_dir}: no *.safetensors weight files")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        try:
            state.update(load_file(shard))
        except Exception as exc:  # SafetensorError: a damaged header or body
            raise CheckpointError(f"cannot read {shard}: {exc}") from exc
    if load_weights is not None:
        try:
            untied = load_weights(state)
        except KeyError as exc:
            raise CheckpointError(f"cannot load {hf_dir}: {exc} (was the checkpoint saved from a different "
                                  "architecture?)") from exc
        if untied:
            raise CheckpointError(f"cannot load {hf_dir}: weights missing from the checkpoint: {sorted(untied)[:5]}")
        return
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise CheckpointError(
            f"cannot load {hf_dir}: weights not in the model: {sorted(result.unexpected_keys)[:5]} "
            "(was the checkpoint saved from a different architecture?)"
        )
    model_state = model.state_dict()
    loaded_storage = {model_state[k].data_ptr() for k in state if k in model_state}
    untied = [k for k in result.missing_keys if model_state[k].data_ptr() not in loaded_storage]
    if untied:
        raise CheckpointError(f"cannot load {hf_dir}: weights missing from the checkpoint: {sorted(untied)[:5]}")
