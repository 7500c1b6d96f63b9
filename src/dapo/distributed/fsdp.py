"""FSDP2 of the actor (``actor.strategy=fsdp2``): sharding, streaming the full weights out, and full state dicts.

What is sharded: ``fully_shard`` on every decoder layer, then on the root (embeddings, final norm, LM head). Every
parameter, its gradient and its AdamW state then live as a 1/N shard (a ``DTensor``) on each of the N ranks; a layer's
full weights exist only while it runs (all-gathered in its forward, again in its backward, freed after).

Why a root wrapper (:class:`ShardedActor`): FSDP2 all-gathers a module's parameters in the forward hooks of the module
it was applied to, and the actor does not call the causal LM's ``forward`` (``dapo.actor.log_probs`` runs the decoder,
then the LM head over chunks of rows, each chunk recomputed in backward). Those calls would reach the root's
parameters unsharded by nobody, and an FSDP root entered once per chunk would run one collective per chunk, whose
number differs between ranks (they hold different tokens): a deadlock. So the root is a module whose ``forward`` runs
a given function on the Hugging Face model, ``root(*args, run=fn)`` = ``fn(hf_model, *args)``: one root forward (one
all-gather of the root's parameters, one reduce-scatter of their gradients in backward) per micro-batch or per
whole no-grad pass, however many chunks run inside. Without ``run`` it is the causal LM's own forward. The wrapper
registers the causal LM's children under their own names, so parameter names, state-dict keys and optimizer order
are those of the Hugging Face model: a checkpoint is the same file whichever strategy wrote it.

Gradients are SUMMED over ranks: each rank's loss is already divided by the mini-batch's global token count (Eq. 12),
so FSDP2's default mean over ranks would shrink every update by N. ``set_gradient_divide_factor(1.0)`` with
``set_force_sum_reduction_for_comms(True)`` makes the reduce-scatter a plain SUM (gloo has no PREMUL_SUM, which a
divide factor alone would ask for).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from dapo.distributed.world import World

if TYPE_CHECKING:
    from dapo.config import ActorConfig, FsdpConfig

__all__ = [
    "ShardedActor",
    "check_strategy",
    "full_optimizer_state",
    "full_model_state",
    "load_full_model_state",
    "load_full_parameters",
    "load_full_optimizer_state",
    "shard_actor",
    "stream_full_parameters",
    "stream_full_state",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

# Attributes the actor's code reads from a Hugging Face causal LM; the wrapper answers them from the model inside.
_DELEGATED = (
    "config",
    "generation_config",
    "get_input_embeddings",
    "gradient_checkpointing_enable",
    "is_gradient_checkpointing",
    "activation_checkpointing_enable",
    "is_activation_checkpointing",
)


class ShardedActor(nn.Module):
    """The FSDP2 root around a Hugging Face causal LM (see the module docstring for why it exists).

    ``hf_model``: the causal LM inside; its submodules are this module's submodules, under the same names.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if any(True for _ in model.parameters(recurse=False)) or any(True for _ in model.buffers(recurse=False)):
            raise TypeError(
                f"{type(model).__name__} holds parameters of its own outside its submodules; the FSDP2 "
                "root wrapper only registers submodules"
            )
        object.__setattr__(self, "_hf", model)  # not a registered child: its names would gain a prefix
        for name, child in model.named_children():
            self.add_module(name, child)

    @property
    def hf_model(self) -> nn.Module:
        return self.__dict__["_hf"]

    def __getattr__(self, name: str) -> Any:
        if name in _DELEGATED:
            return getattr(self.__dict__["_hf"], name)
        return super().__getattr__(name)

    def train(self, mode: bool = True) -> ShardedActor:
        super().train(mode)
        self.hf_model.train(mode)  # the causal LM's own flag too: it is not one of this module's children
        return self

    def forward(self, *args: Any, run: Any = None, **kwargs: Any) -> Any:
        if run is None:
            return self.hf_model(*args, **kwargs)
        # Per-sample results are often views (torch.split); FSDP2 hooks the outputs for backward, and warns that an
        # in-place op on a view would lose its hook. Copies of these small per-token tensors have no such trap.
        return _tree_map_tensors(lambda t: t.clone() if t._base is not None else t, run(self.hf_model, *args, **kwargs))


def _tree_map_tensors(fn: Any, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_tree_map_tensors(fn, v) for v in value)
    return value


def check_strategy(cfg: ActorConfig, world: World) -> None:
    """Refuse ``actor.strategy=fsdp2`` in a single process: one rank has nothing to shard, and the single-process
    path deliberately never creates a process group (it stays bit-for-bit what it was)."""
    if cfg.strategy == "fsdp2" and not world.distributed:
        raise ValueError(
            "actor.strategy=fsdp2 shards the actor over the ranks of torchrun and needs at least 2 "
            "(torchrun --nproc-per-node N -m dapo.cli.main train ...); one process has nothing to shard, "
            "use actor.strategy=replicated"
        )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a Hugging Face causal LM (``model.get_decoder().layers``), the FSDP2 units."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise TypeError(
            f"{type(model).__name__}: actor.strategy=fsdp2 shards the decoder layers and finds none at "
            "get_decoder().layers"
        )
    return list(layers)


def shard_actor(
    model: nn.Module,
    cfg: FsdpConfig,
    world: World,
    *,
    gradient_checkpointing: bool = False,
    checkpoint_context_fn: Callable[[], tuple[Any, Any]] | None = None,
) -> ShardedActor:
    """``fully_shard`` every decoder layer of ``model``, then the root; gradients are summed over ranks.

    Build the optimizer after this (it must hold the sharded parameters). Gradient checkpointing is switched on
    before sharding, as the layers' own ``__call__`` wraps the FSDP hooks then; ``checkpoint_context_fn`` is
    ``torch.utils.checkpoint``'s ``context_fn`` for its layers (``dapo.actor.update.checkpoint_context_fn``: under
    MoE routing replay a layer's recompute replays its forward's routes).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not world.distributed:
        raise ValueError("shard_actor needs a distributed World (torchrun with >= 2 ranks)")
    if checkpoint_context_fn is not None and not gradient_checkpointing:
        raise ValueError("shard_actor: a checkpoint_context_fn needs gradient_checkpointing=True")
    if gradient_checkpointing:
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if checkpoint_context_fn is not None:
            kwargs["context_fn"] = checkpoint_context_fn
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    # The forward inputs are token ids (never cast) and a TrainBatch; casting its float tensors would change nothing
    # the forward reads, so inputs are left alone.
    mp = MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype], cast_forward_inputs=False
    )
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cfg.cpu_offload else OffloadPolicy()
    mesh = world.device_mesh()  # the trainer ranks' own group when other ranks of the job serve the rollout
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload)
    root = ShardedActor(model)
    fully_shard(root, mesh=mesh, mp_policy=mp, offload_policy=offload)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


def stream_full_parameters(model: nn.Module, *, trainable_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` of every parameter (``trainable_only``: of those that train, a LoRA actor's adapters),
    one at a time: each shard is all-gathered when it is asked for (every rank must iterate to the end, in the same
    order) and may be freed once the consumer copied it, so at most one full parameter exists beside the shards, never
    a whole gathered state dict."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad or not trainable_only:
                yield name, _full(param)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of a (possibly sharded) tensor: a DTensor is all-gathered, a local tensor is itself. A collective
    for a DTensor: every rank must ask for the same tensors in the same order."""
    if not isinstance(tensor, DTensor):
        return tensor.detach()
    if tensor.device.type != tensor.device_mesh.device_type:  # CPU-offloaded shards: NCCL gathers on the GPU
        tensor = tensor.to(tensor.device_mesh.device_type)  # (this branch has not run on a GPU)
    return tensor.full_tensor()


def stream_full_state(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(key, full tensor)`` of the model's state dict (parameters and persistent buffers), one at a time, for the
    Hugging Face export of a sharded checkpoint: rank 0 holds one gathered tensor beside its shards, not the whole
    state. A key tied to an earlier one (``lm_head.weight`` sharing the embeddings) is left out, as ``save_pretrained``
    leaves it out. A collective, like :func:`stream_full_parameters`."""
    seen: set[int] = set()
    with torch.no_grad():
        for key, value in model.state_dict(keep_vars=True).items():
            if id(value) in seen:
                continue
            seen.add(id(value))
            yield key, _full(value)


def _options(**kwargs: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full (gathered) model state dict on rank 0, in CPU memory; empty on the other ranks. A collective.

    A key tied to an earlier one (``lm_head.weight`` sharing the embeddings' parameter) is left out, as
    ``save_pretrained`` leaves it out of a replicated model's export: gathered, the two would be separate copies.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    full = get_model_state_dict(model, options=_options(cpu_offload=True))
    seen: set[int] = set()
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            full.pop(key, None)
        seen.add(id(value))
    return full


def _optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter name of each optimizer slot, in ``optimizer.state_dict()``'s index order."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full optimizer state on rank 0 (CPU), in ``optimizer.state_dict()``'s format (slots keyed by index, as a
    replicated actor saves it), so either strategy resumes from it; empty on the other ranks. A collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
    if not by_name:
        return {}
    names = _optimizer_names(model, optimizer)
    groups = optimizer.state_dict()["param_groups"]  # the hyper-parameters and index lists, as a plain optimizer has
    return {
        "state": {i: by_name["state"][n] for i, n in enumerate(names) if n in by_name["state"]},
        "param_groups": groups,
    }


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load an index-keyed full optimizer state (every rank passes the same) into the sharded optimizer."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = _optimizer_names(model, optimizer)
    groups = state["param_groups"]
    if sum(len(g["params"]) for g in groups) != len(names):
        raise ValueError(
            f"the optimizer state holds {sum(len(g['params']) for g in groups)} parameters, this actor {len(names)}"
        )
    by_name = {
        "state": {names[int(i)]: v for i, v in state["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in groups],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=_options())


def load_full_parameters(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load full tensors of some of the model's parameters (every rank passes the same; a LoRA actor's adapters) into
    the sharded model, leaving the others as they are. A collective."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    own = dict(model.named_parameters())
    unexpected = sorted(k for k in state if k not in own)
    if unexpected:
        raise KeyError(f"weights not in the model: {unexpected[:5]}")
    set_model_state_dict(model, state, options=_options(strict=False))


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Load a full state dict (every rank passes the same) into the sharded model; returns the model's keys that
    ``state`` lacks and that are not tied to one it has (empty when everything loaded).

    A Hugging Face export omits tied weights (``lm_head.weight`` tied to the embeddings); such a key takes the tensor
    of the key it is tied to, so the load can be strict.
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    own = model.state_dict(keep_vars=True)
    unexpected = sorted(k for k in state if k not in own)
    if unexpected:
        raise KeyError(f"weights not in the model: {unexpected[:5]}")
    state = dict(state)
    missing = []
    for key in own:
        if key in state:
            continue
        tied = next((k for k in state if k in own and own[k] is own[key]), None)
        if tied is None:
            missing.append(key)
        else:
            state[key] = state[tied]
    if missing:
        return missing
    set_model_state_dict(model, state, options=_options())
    return []
