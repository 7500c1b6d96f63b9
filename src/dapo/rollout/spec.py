"""What an engine is, apart from the weights it loads: :class:`EngineSpec`, and the vLLM-only settings it carries.

Plain data, no torch: the CLI, the config checks and a spawned rollout worker read and pickle it cheaply. The engine
settings every engine understands sit on :class:`EngineSpec` itself; the ones only vLLM reads sit on
:class:`VLLMOptions`, nested, so that the Transformers engine's spec holds nothing it ignores but that one field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class VLLMOptions:
    """vLLM's own settings, as vLLM names them (``rollout.*`` keys of the same names, docs/config.md).

    Attributes:
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache). On CPU it is the share of host
            memory it reserves, and is only used when ``cpu_kvcache_space_gb`` is None.
        enforce_eager: no CUDA graphs / torch.compile (CPU start-up would otherwise compile for minutes).
        max_num_batched_tokens: tokens per engine step (None: vLLM's default).
        max_num_seqs: most sequences per engine step (None: vLLM's default).
        free_cache_engine: on GPU, sleep (weights offloaded, KV cache freed) between generations; ignored on CPU.
        cpu_kvcache_space_gb: KV cache size on CPU, GiB (None: sized from ``gpu_memory_utilization``).
        enable_prefix_caching: reuse the KV cache of shared prompt prefixes (the ``n`` samples of a prompt).
    """

    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    free_cache_engine: bool = False
    cpu_kvcache_space_gb: float | None = 1.0
    enable_prefix_caching: bool = True


@dataclass(frozen=True)
class EngineSpec:
    """What an engine is, apart from the weights it loads (a :class:`~dapo.model.loading.Policy`).

    Attributes:
        name: a registered engine (``dapo.rollout.factory.ENGINE_NAMES``); ``dapo.rollout.loaded_engine`` also takes
            ``auto`` (the device's default engine).
        dtype: weights/activations dtype: ``auto`` (resolved by the factory as the engine's registry entry says:
            hf: the actor's; vllm: float32 on CPU, bfloat16 on a GPU) or a torch dtype name. An engine built
            directly (not through the factory) takes a torch dtype name only.
        seed: the engine's own random seed (engines that cannot seed each request draw from it).
        max_model_len: prompt + response tokens at most (vllm's context length); None: the engine's default.
        max_batch_size: hf: sequences decoded per call (None: all at once).
        tensor_parallel_size: ranks per engine (only engines whose capabilities say ``tensor_parallel``; the others
            refuse anything but 1).
        join_process_group: the engine lives inside an initialised torch.distributed group (torchrun).
        vllm: vLLM's own settings (:class:`VLLMOptions`); the other engines ignore them.
    """

    name: str = "hf"
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    max_batch_size: int | None = None
    tensor_parallel_size: int = 1
    join_process_group: bool = False
    vllm: VLLMOptions = VLLMOptions()

    def replace(self, **changes: object) -> EngineSpec:
        return dataclasses.replace(self, **changes)
