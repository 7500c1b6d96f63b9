"""Restoring a checkpoint into a model, optimizer, scheduler and the RNG streams: either format, any world size.

Resume equality: parameters, optimizer and scheduler state and every RNG stream are restored exactly, so continuing
training after a load gives bit-identical parameters to a run that was never interrupted (on CPU; CUDA kernels may
add their own non-determinism). A checkpoint that does not verify (``manifest``) is refused before any file of it is
parsed, and every ``.pt`` file is read with ``torch.load(weights_only=True)``, so loading never runs pickled code.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dapo.infra.checkpoint.errors import CheckpointError
from dapo.infra.checkpoint.layout import SHARDED_DIR, SHARDED_LAYOUT, rank_rng_name
from dapo.infra.checkpoint.manifest import manifest_problem, read_manifest
from dapo.infra.checkpoint.rng import restore_rng_state


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
    problem = manifest_problem(path, verify=True)
    if problem is not None:
        raise CheckpointError(f"cannot load {path}: not a complete checkpoint ({problem})")

    sharded = read_manifest(path).get("layout") == SHARDED_LAYOUT
    rng_file = path / "rng.pt"
    if sharded:
        _load_sharded_state(path / SHARDED_DIR, model, optimizer)
        rank = _process_rank()
        # The same world size continues every rank's own streams (exact resume); another one takes rank 0's, as a
        # full checkpoint hands rank 0's to every rank.
        rng_file = path / rank_rng_name(rank if (path / rank_rng_name(rank)).is_file() else 0)
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
    restore_rng_state(_torch_load(rng_file), rng_file)  # last: nothing above may draw from it
    return trainer_state


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
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

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
        raise CheckpointError(
            f"cannot load the sharded state in {folder} into this model: "
            f"{type(exc).__name__}: {str(exc)[:500]} (was it saved from a different "
            "architecture?)"
        ) from exc


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc


def _keyed_as_the_model(
    hf_dir: Path, model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``state`` (the ``hf/`` folder's tensors) keyed as ``model`` holds them.

    ``save_pretrained`` writes some families in their published layout rather than the module's: Transformers 5 holds
    a MoE layer's experts fused (``mlp.experts.gate_up_proj``) and saves them one per expert
    (``mlp.experts.0.gate_proj.weight``), as the Hub's checkpoints are, converting back in ``from_pretrained``. Where
    the keys differ, the folder is read by ``from_pretrained`` into a CPU copy in the saved dtype (Transformers' own
    conversion, whatever the family's: stacking and concatenating, exact) and the copy's state is returned; a folder
    of another architecture still fails the caller's key check. Costs one more copy of the weights while resuming,
    only for such families."""
    from transformers import PreTrainedModel

    own = model.state_dict().keys()
    if all(key in own for key in state):
        return state
    hf_model = model if isinstance(model, PreTrainedModel) else getattr(model, "hf_model", None)
    if not isinstance(hf_model, PreTrainedModel) or _model_type(hf_dir) != hf_model.config.model_type:
        return state
    dtype = next(iter(state.values())).dtype
    try:
        copy = type(hf_model).from_pretrained(hf_dir, dtype=dtype)
    except Exception:  # noqa: BLE001 - not this architecture's folder: the caller's check names the keys
        return state
    converted = copy.state_dict()
    return converted if all(key in own for key in converted) else state


def _model_type(hf_dir: Path) -> str | None:
    try:
        return json.loads((hf_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _load_model_weights(
    hf_dir: Path, model: torch.nn.Module, load_weights: Callable[[dict[str, torch.Tensor]], list[str]] | None = None
) -> None:
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
    state = _keyed_as_the_model(hf_dir, model, state)
    if load_weights is not None:
        try:
            untied = load_weights(state)
        except KeyError as exc:
            raise CheckpointError(
                f"cannot load {hf_dir}: {exc} (was the checkpoint saved from a different architecture?)"
            ) from exc
        if untied:
            raise CheckpointError(f"cannot load {hf_dir}: weights missing from the checkpoint: {sorted(untied)[:5]}")
        return
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape: another model's checkpoint
        said = str(exc).strip().splitlines()
        raise CheckpointError(
            f"cannot load {hf_dir}: {said[1].strip() if len(said) > 1 else said[0]} (was the checkpoint saved from "
            "a different architecture?)"
        ) from None
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
