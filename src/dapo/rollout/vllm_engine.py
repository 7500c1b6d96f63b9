"""A rollout engine over vLLM (``vllm`` on a GPU, ``vllm-cpu`` on a CPU), run in the trainer's own process.

It implements :class:`dapo.rollout.base.RolloutEngine` with the same semantics as the Hugging Face engine
(:mod:`dapo.rollout.hf_engine`, :func:`dapo.rollout.sampler.sample_next_tokens`);
``tests/rollout/test_engine_contract.py`` runs one contract over both. vLLM is imported lazily: this module imports
without it, and :func:`vllm_available` says whether (and why not) it can be used. Install:
``bash scripts/install_vllm_cpu.sh`` (CPU), ``pip install vllm`` (GPU). docs/vllm.md has the longer story. What had
to be right, and why:

**In-process engine.** ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set before the ``LLM`` is built, unless the caller
already set it): the engine core and, with ``tensor_parallel_size == 1``, the worker run in this process.
``update_weights`` then hands the actor's tensors to the worker without serialising them, ``params.seed`` can
re-seed the worker's RNG and restore the caller's afterwards, and no ``if __name__ == "__main__"`` guard is needed
(nothing is spawned). Under torchrun (``join_process_group=True``) every rank is one worker of an engine, in process,
through vLLM's ``external_launcher`` backend: vLLM builds its groups inside the trainer's world (tensor parallel over
consecutive ranks, independent engines beyond), and ``close`` leaves the trainer's default process group standing.

**Log-probs.** ``logprobs_mode="processed_logprobs"``: vLLM then reports log_softmax of the logits after temperature and
top-k/top-p masking, which is the distribution the token was drawn from (dapo's contract). Read from vLLM 0.32's
``v1/sample/sampler.py`` and ``ops/topk_topp_sampler.py``:

* random sampling: ``logits / T`` -> top-k mask (ties at the k-th value kept) -> top-p mask (drop a token when the
  ascending cumulative mass up to and including it is <= 1 - p, i.e. when the tokens strictly more likely already reach
  p) -> ``log_softmax``. Same sets as :func:`dapo.rollout.sampler.truncate_logits`, up to float rounding at the
  boundary.
* greedy (``temperature == 0``): a batch that is all greedy returns ``log_softmax(logits)`` at temperature 1 over the
  full vocabulary, as dapo wants. Every call here sends one ``SamplingParams`` for all prompts, so batches are never
  mixed (in a mixed batch vLLM also treats greedy rows at temperature 1, full vocabulary).
* prompt log-probs (used by :meth:`VLLMRolloutEngine.log_probs_of`) skip all sampling processors: ``log_softmax`` of the
  raw logits, temperature 1, full vocabulary, in either "processed" or "raw" mode. Requests asking for prompt log-probs
  never read the prefix cache (vLLM sets ``skip_reading_prefix_cache``), so the probe always recomputes.

**Where vLLM and the HF engine cannot match** (both refused or adapted here rather than silently differing):

* ``0 < temperature < 0.01``: vLLM raises it to 0.01 (and treats < 1e-5 as greedy), so the reported log-probs would be
  at another temperature than asked. :meth:`generate` raises ``ValueError``; use 0 for greedy.
* greedy with ``n > 1``: vLLM refuses it; the engine samples once and repeats the sample ``n`` times (the HF engine's
  ``n`` greedy rows are identical too).
* ``len(prompt) + max_tokens > max_model_len``: vLLM silently stops early with finish "length" (measured: 14 of 20
  tokens), which would break "length means exactly max_tokens". :meth:`generate` raises ``ValueError``. Likewise
  :meth:`log_probs_of` needs ``len(prompt) + len(response) + 1 <= max_model_len`` (vLLM must generate one token after
  the teacher-forced sequence), so size ``max_model_len`` as max prompt + max response + 1.
* sampled tokens are drawn differently (vLLM: Gumbel-max / exponential race; HF engine: inverse CDF), so the same seed
  gives different samples in the two engines; each engine is reproducible for itself. Greedy outputs agree up to
  argmax ties.

**Termination.** ``ignore_eos=True`` plus ``stop_token_ids = eos_token_ids | params.stop_token_ids``: the engine's stop
set is exactly dapo's, not whatever EOS vLLM reads from the tokenizer / generation config. vLLM keeps the stop token in
``token_ids``. ``generation_config="vllm"`` keeps the model folder's generation_config.json out of the defaults.

**Seeds.** A per-request ``vllm.SamplingParams(seed=...)`` fails on CPU ("CPU Generator does not use offset":
``gpu_model_runner`` rewinds a seeded request's generator with ``set_offset`` whenever the step discards its token, e.g.
a chunked prefill); on GPU it works but takes a slower per-request path. The engine-level seed, by contrast, is just
the worker's global torch RNG, which vLLM's samplers draw from (CPU: one ``torch.randint`` seed per row and step for
the fused Gumbel-argmax kernel; GPU: ``exponential_()``). So ``params.seed`` is honoured by re-seeding the worker's
torch RNG (``torch.manual_seed`` through ``LLM.collective_rpc``) and resetting the prefix cache right before the call,
inside ``torch.random.fork_rng`` so that the caller's RNG (the same RNG, in process) is left as it was. The draws
then depend only on the weights, the prompts, the params and the seed: the same call reproduces exactly, including
after a restart (exact resume). ``seed=None`` draws from the process's torch RNG, like the HF engine's
``seed=None`` (vLLM seeds the process's RNGs with the engine ``seed`` while starting; the constructor restores them).
``SamplingParams.prompt_seeds`` (per-prompt streams, which make the HF engine's samples independent of the batch and
so of the data-parallel split) are ignored for the same reason: the call samples from ``params.seed``, so a prompt's
samples depend on the other prompts of the call, and ranks under torchrun sample other responses than one process.
On a GPU, per-request ``vllm.SamplingParams(seed=...)`` from the prompt seeds would give that invariance (untried).

**Weights.** :meth:`update_weights` runs the worker's ``reload_weights(weights_iterator=...)`` through
``LLM.collective_rpc`` and then ``LLM.reset_prefix_cache()``. ``reload_weights`` is vLLM's layerwise in-place reload of
checkpoint-format (Hugging Face-named) weights: it re-runs each layer's weight loader (fusing q/k/v and gate/up,
sharding for tensor parallelism, re-quantising, CPU weight packing) and keeps the current tensors of layers not given.
It is the loading path that vLLM's native weight-transfer API (``init_weight_transfer_engine`` /
``start_weight_update`` / ``update_weights`` / ``finish_weight_update``) ends in too; that API's transports are NCCL and
CUDA IPC (GPU only) and on 0.32 it is exposed on ``AsyncLLM``, not ``LLM``. Calling the model's ``load_weights``
directly fails after start-up ("'Parameter' object has no attribute 'weight_loader'"). Two things had to be added:

* tied embeddings: vLLM's Qwen2 skips ``lm_head.*`` when ``tie_word_embeddings`` is set and its lm_head shares the
  embedding parameter, but on CPU each linear layer computes from a copy packed once after loading, and the reload does
  not re-pack the lm_head (it gets no tensor of its own). The worker-side function re-processes every lm_head tied to an
  embedding after the reload; without it the logits kept the old embedding (log-prob gap ~0.7).
* partial pushes: a layer given only in part (``q_proj`` without ``k_proj``/``v_proj``, a weight without its bias) is
  processed with the rest uninitialised (log-prob gaps of 7-10 measured). ``update_weights`` checks the names against
  the checkpoint's and refuses such a push before loading anything; whole layers, or all of ``named_parameters()``, are
  fine.

**CPU settings.** The KV cache size is given explicitly (``kv_cache_memory_bytes`` from ``cpu_kvcache_space_gb``,
default 1 GiB; the legacy ``VLLM_CPU_KVCACHE_SPACE`` env var, whole GiB, overrides it); ``gpu_memory_utilization`` is
then unused on CPU (otherwise it is the share of host memory vLLM reserves). ``enforce_eager=True`` by default: on CPU
the alternative is an inductor compile of the model at start-up (minutes); on a GPU pass False for CUDA graphs. vLLM's
CPU worker replaces ``torch.set_num_threads`` with a no-op in the whole process (it expects to own its thread
binding, which only happens in its spawned multi-process workers) and puts libgomp in ``LD_PRELOAD`` for its
subprocesses; the constructor puts back ``torch.set_num_threads``, the thread count and ``LD_PRELOAD`` (nothing is
spawned after start-up), so the trainer keeps control of its threads. Sleep mode (``free_cache_engine``) is
CUDA/ROCm/XPU only: on CPU it is switched off with a log line.

**Multi-head latent attention on CPU** (DeepSeek-V2/V3): vLLM's CPU rotary kernel mishandles the 3-D query MLA hands
it, so before building an engine on a CPU ``dapo.rollout.vllm_cpu_rope`` routes such inputs through it flat (its
docstring has the measurements). And on a host with AMX vLLM picks its AMX MLA backend, which takes 16-bit or
quantised weights only ("expect weight to be bfloat16, float16, int8, ...") and fails at load for the fp32 engine, the
CPU default; an fp32 engine on a CPU with an MLA model asks for vLLM's reference ``CPU_MLA`` backend instead (the one a
host without AMX gets anyway).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import json
import logging
import math
import os
import random
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dapo.rollout.base import RolloutOutput, SamplingParams, WeightStream
from dapo.rollout.errors import EngineUnavailableError
from dapo.rollout.spec import EngineSpec
from dapo.rollout.vllm_cpu_rope import flatten_heads_for_cpu_rotary_embedding
from dapo.rollout.vllm_lora import VLLMAdapterSlot

if TYPE_CHECKING:
    from dapo.model.loading import Policy

logger = logging.getLogger(__name__)

CPU_INSTALL_COMMAND = "bash scripts/install_vllm_cpu.sh"
GPU_INSTALL_COMMAND = "pip install vllm"
_MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
# vLLM raises any temperature in (0, 0.01) to 0.01 (vllm.sampling_params._MAX_TEMP).
_VLLM_MIN_TEMPERATURE = 1e-2
_DTYPES = ("float32", "bfloat16", "float16")  # EngineSpec's "auto" is resolved by the factory


class VLLMUnavailableError(ImportError):
    """vLLM is not installed, or is installed but cannot be imported; the message says how to fix it."""


def _install_hint() -> str:
    if torch.cuda.is_available():
        return f"install it with `{GPU_INSTALL_COMMAND}`"
    return f"install the CPU build with `{CPU_INSTALL_COMMAND}` (`{GPU_INSTALL_COMMAND}` on a GPU machine)"


def _explain_import_failure(error: BaseException) -> str:
    """A one-paragraph reason for a failed ``import vllm``, naming the fix for the failures seen in practice."""
    chain, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    text = " <- ".join(chain)
    if "torchvision::nms" in text or ("torchvision" in text and "operator" in text):
        return (
            "vLLM is installed but cannot be imported: the installed torchvision was built for another torch "
            f"({text}). Nothing here needs torchvision: `pip uninstall -y torchvision` (scripts/install_vllm_cpu.sh "
            "does this)."
        )
    for package in ("torchaudio", "torchcodec"):
        if package in text:
            return (
                f"vLLM is installed but cannot be imported because of {package} ({text}); "
                f"`pip uninstall -y {package}` (scripts/install_vllm_cpu.sh does this when needed)."
            )
    return f"vLLM is installed but cannot be imported ({text}); reinstall it: {_install_hint()}."


@functools.lru_cache(maxsize=1)
def _import_vllm() -> Any:
    """Import vLLM's offline API once; raise :class:`VLLMUnavailableError` with a fix when that is impossible."""
    if importlib.util.find_spec("vllm") is None:
        raise VLLMUnavailableError(f"vLLM is not installed; {_install_hint()}.")
    try:
        import vllm
        from vllm.inputs import TokensPrompt  # noqa: F401  (part of what the engine needs)
    except Exception as error:  # the torchvision breakage is a RuntimeError raised while importing
        raise VLLMUnavailableError(_explain_import_failure(error)) from error
    return vllm


def vllm_available() -> tuple[bool, str]:
    """``(True, "vllm <version>")`` when the engine can be built, else ``(False, reason with the fix)``.

    The first call imports vLLM (about 10 s on a 2-core CPU); the answer is cached.
    """
    try:
        vllm = _import_vllm()
    except VLLMUnavailableError as error:
        return False, str(error)
    return True, f"vllm {vllm.__version__}"


def _reload_weights_on_worker(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Run on each vLLM worker (``LLM.collective_rpc``): layerwise-reload checkpoint-format weights, then re-process
    output layers tied to the input embedding.

    The re-processing is needed on CPU: there every linear layer, the tied ``lm_head`` included, packs its weight
    for oneDNN / the SGL GEMM once after loading and computes from that packed copy. The reload re-processes the layers
    it loads (``embed_tokens``) but not ``lm_head``, which receives no tensor of its own, so without this the logits
    kept coming from the old embedding (log-prob gaps of ~0.7 after an embedding change). On GPU the unquantized lm_head
    reads the shared parameter directly and this is a no-op.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    model = worker.get_model()
    embeddings = [
        module.weight
        for module in model.modules()
        if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead)
    ]
    for module in model.modules():
        if isinstance(module, ParallelLMHead) and any(module.weight is weight for weight in embeddings):
            module.quant_method.process_weights_after_loading(module)


class _BenignReloadWarnings(logging.Filter):
    """Drops the reload's "<layer>: Failed to load weights" warning for layers that never get a checkpoint tensor: the
    rotary embedding (a computed cache) and a tied lm_head (it is the embedding). They would appear on every push."""

    def __init__(self, layers: frozenset[str]) -> None:
        super().__init__()
        self.layers = layers

    def filter(self, record: logging.LogRecord) -> bool:
        benign = record.msg == "%s: Failed to load weights" and bool(record.args) and record.args[0] in self.layers
        return not benign


def _packed_modules_of(model: torch.nn.Module) -> dict[str, list[str]]:
    """Run on a vLLM worker (``LLM.apply_model``): which checkpoint modules vLLM fuses into one layer."""
    return {fused: list(parts) for fused, parts in getattr(model, "packed_modules_mapping", {}).items()}


def _layer_key(name: str, shard_to_fused: dict[str, str]) -> str:
    """The vLLM layer a checkpoint tensor loads into: ``...self_attn.k_proj.bias`` -> ``...self_attn.qkv_proj``."""
    module = name.rpartition(".")[0]
    parent, _, leaf = module.rpartition(".")
    fused = shard_to_fused.get(leaf)
    return f"{parent}.{fused}" if fused else module


def _checkpoint_layers(model_path: str, packed: dict[str, list[str]]) -> dict[str, frozenset[str]] | None:
    """Checkpoint tensor names grouped by the vLLM layer they load into (None when the folder has no safetensors)."""
    from safetensors import safe_open

    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        return None
    shard_to_fused = {part: fused for fused, parts in packed.items() for part in parts}
    layers: dict[str, set[str]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                layers.setdefault(_layer_key(name, shard_to_fused), set()).add(name)
    return {key: frozenset(names) for key, names in layers.items()}


def _seed_worker_rng(worker: Any, seed: int) -> None:
    """Run on each vLLM worker (``LLM.collective_rpc``): seed the torch RNG its samplers draw from (CPU and CUDA)."""
    torch.manual_seed(seed)


def _process_rng_states() -> tuple[Any, ...]:
    import numpy as np

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _restore_process_rng_states(states: tuple[Any, ...]) -> None:
    import numpy as np

    python_state, numpy_state, torch_state, cuda_state = states
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    if cuda_state is not None:
        torch.cuda.set_rng_state_all(cuda_state)


@contextlib.contextmanager
def _keeping_default_process_group(keep: bool) -> Iterator[None]:
    """While vLLM shuts down, destroy only the process groups vLLM made (``_WORLD`` and the model-parallel groups),
    not torch's default group: under torchrun that one belongs to the trainer, which still has collectives to run.
    vLLM 0.32's ``cleanup_dist_env_and_memory`` calls ``destroy_distributed_environment``, which also destroys the
    default group; the module attribute is swapped for the duration of the shutdown."""
    if not keep:
        yield
        return
    from vllm.distributed import parallel_state

    original = parallel_state.destroy_distributed_environment

    def destroy_vllm_groups_only() -> None:
        if parallel_state._WORLD is not None:
            parallel_state._WORLD.destroy()
        parallel_state._WORLD = None
        parallel_state._NODE_COUNT = None

    parallel_state.destroy_distributed_environment = destroy_vllm_groups_only
    try:
        yield
    finally:
        parallel_state.destroy_distributed_environment = original


def explain_stale_cpu_shm(error: BaseException, shm_dir: str = "/dev/shm") -> str | None:
    """What to do when vLLM's CPU backend cannot create its tensor-parallel shared memory because it exists (EEXIST),
    or None for any other error.

    Under torchrun (``external_launcher``) vLLM names the segments of a tensor-parallel group the same for every job on
    a machine (``/dev/shm/-tp:0-[0-1]-cpushm_<rank>`` for ranks 0-1); a job killed with SIGKILL never removes them, and
    the next tp>1 job then fails at start-up with vLLM's bare "create shm in SHMManager failed. errno: 17"."""
    text = str(error)
    if "create shm in SHMManager failed" not in text or "errno: 17" not in text:
        return None
    try:
        found = sorted(name for name in os.listdir(shm_dir) if "-cpushm" in name)
    except OSError:
        found = []
    listing = ", ".join(f"{shm_dir}/{name}" for name in found[:8]) or f"segments named *-cpushm_* in {shm_dir}"
    return (
        f"vLLM's CPU tensor-parallel shared memory already exists ({listing}): an earlier tensor-parallel vLLM "
        "job on this machine was killed before it could remove it, or one is running now (vLLM gives every "
        "torchrun job the same names). If none is running, remove them (rm /dev/shm/*-cpushm_*) and start again"
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _uses_latent_attention(model_path: str | Path) -> bool:
    """Whether the folder's model has multi-head latent attention: a ``kv_lora_rank`` in its config (or its text
    model's), as vLLM decides it."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # vLLM reports what is wrong with the folder when it loads it
    return any(c.get("kv_lora_rank") is not None for c in (config, config.get("text_config") or {}))


class VLLMRolloutEngine:
    """Rollout engine over an in-process vLLM ``LLM``. Implements :class:`dapo.rollout.base.RolloutEngine`.

    Built by the factory (:func:`build_vllm_engine`); its settings are an :class:`~dapo.rollout.spec.EngineSpec`
    whose vLLM-only settings are ``spec.vllm`` (:class:`~dapo.rollout.spec.VLLMOptions`, verl's rollout config
    keys).

    Args:
        model_path: Hugging Face model folder (config.json, weights, tokenizer).
        spec: what the engine reads of it:

            * ``dtype``: "float32" (matches an fp32 actor, the CPU case), "bfloat16" or "float16"; ``auto`` is the
              factory's to resolve (``engine_compute_dtype``), so it is refused here.
            * ``seed``: vLLM's engine seed. In process, ``SamplingParams(seed=None)`` draws from the caller's torch
              RNG.
            * ``tensor_parallel_size``: devices per engine. In one process, above 1 the workers are separate
              processes and ``update_weights`` sends tensors through vLLM's RPC (serialised): correct, not fast.
              Under torchrun (``join_process_group``) each rank is one tensor-parallel shard of the engine, in
              process.
            * ``max_model_len``: longest prompt + response the engine accepts (None: the model's
              ``max_position_embeddings``). ``log_probs_of`` needs one token more than the longest prompt + response.
            * ``vllm``: vLLM's own settings. ``free_cache_engine`` puts the engine to sleep after each ``generate``
              and wakes it before the next use (ignored, logged, on CPU); ``enable_prefix_caching``'s cache is reset
              on every weight update and before every seeded ``generate``; ``cpu_kvcache_space_gb`` is not used on
              GPU.
        eos_token_ids: id(s) that end a response; ``SamplingParams.stop_token_ids`` are added per request.
        lora_config: a LoRA actor's adapter config (``adapter_config.json``'s content): vLLM then runs the adapter
            natively, ``update_weights`` takes the adapter's tensors only (``dapo.rollout.vllm_lora``), and until the
            first push the engine generates from the base model.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        spec: EngineSpec,
        *,
        eos_token_ids: int | Sequence[int],
        lora_config: Mapping[str, Any] | None = None,
    ) -> None:
        options = spec.vllm
        dtype, seed, tensor_parallel_size = spec.dtype, spec.seed, spec.tensor_parallel_size
        max_model_len, join_process_group = spec.max_model_len, spec.join_process_group
        gpu_memory_utilization, cpu_kvcache_space_gb = options.gpu_memory_utilization, options.cpu_kvcache_space_gb
        max_num_batched_tokens, max_num_seqs = options.max_num_batched_tokens, options.max_num_seqs
        free_cache_engine = options.free_cache_engine
        self._llm: Any = None  # set last, so that close() after a failed start is a no-op
        self._adapter: VLLMAdapterSlot | None = None
        eos = (eos_token_ids,) if _is_int(eos_token_ids) else tuple(eos_token_ids)  # type: ignore[arg-type]
        if not eos or not all(_is_int(t) and t >= 0 for t in eos):
            raise ValueError(f"VLLMRolloutEngine: eos_token_ids must be non-negative ints, got {eos_token_ids!r}")
        self.eos_token_ids: tuple[int, ...] = eos
        if dtype not in _DTYPES:
            raise ValueError(
                f"VLLMRolloutEngine: dtype must be one of {_DTYPES}, got {dtype!r} (build the engine "
                "through dapo.rollout.factory to have 'auto' resolved)"
            )
        if not _is_int(seed) or seed < 0:
            raise ValueError(f"VLLMRolloutEngine: seed must be an int >= 0, got {seed!r}")
        if not isinstance(gpu_memory_utilization, (int, float)) or not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"VLLMRolloutEngine: gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
            )
        if not _is_int(tensor_parallel_size) or tensor_parallel_size < 1:
            raise ValueError(
                f"VLLMRolloutEngine: tensor_parallel_size must be an int >= 1, got {tensor_parallel_size!r}"
            )
        for name, value in (
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_model_len", max_model_len),
            ("max_num_seqs", max_num_seqs),
        ):
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"VLLMRolloutEngine: {name} must be None or an int >= 1, got {value!r}")
        if cpu_kvcache_space_gb is not None and (
            not isinstance(cpu_kvcache_space_gb, (int, float))
            or not math.isfinite(cpu_kvcache_space_gb)
            or cpu_kvcache_space_gb <= 0
        ):
            raise ValueError(
                f"VLLMRolloutEngine: cpu_kvcache_space_gb must be None or > 0, got {cpu_kvcache_space_gb!r}"
            )

        vllm = _import_vllm()
        from vllm.platforms import current_platform

        # In-process engine core (see the module docstring); respect a caller who chose otherwise.
        os.environ.setdefault(_MULTIPROCESSING_ENV, "0")
        if join_process_group:
            if not torch.distributed.is_initialized():
                raise ValueError(
                    "VLLMRolloutEngine: join_process_group=True needs an initialised torch.distributed "
                    "process group (torchrun)"
                )
            if os.environ[_MULTIPROCESSING_ENV] != "0":
                raise ValueError(
                    f"VLLMRolloutEngine: under torchrun the engine runs in each rank's process; unset "
                    f"{_MULTIPROCESSING_ENV} (it is {os.environ[_MULTIPROCESSING_ENV]!r})"
                )
        self.joined_process_group = bool(join_process_group)
        self._in_process = os.environ[_MULTIPROCESSING_ENV] == "0" and (tensor_parallel_size == 1 or join_process_group)
        self.on_cpu = bool(current_platform.is_cpu())
        sleep_mode = bool(free_cache_engine) and bool(current_platform.is_sleep_mode_available())
        if free_cache_engine and not sleep_mode:
            logger.info(
                "VLLMRolloutEngine: free_cache_engine ignored: vLLM has no sleep mode on this platform (%s)",
                current_platform.device_name,
            )
        self.free_cache_engine = sleep_mode

        kwargs: dict[str, Any] = {
            "model": str(model_path),
            "dtype": dtype,
            "seed": seed,
            "gpu_memory_utilization": float(gpu_memory_utilization),
            "tensor_parallel_size": tensor_parallel_size,
            "enforce_eager": bool(options.enforce_eager),
            "enable_prefix_caching": bool(options.enable_prefix_caching),
            "enable_sleep_mode": sleep_mode,
            # Sampled-token log-probs after temperature and top-k/top-p: dapo's contract (module docstring).
            "logprobs_mode": "processed_logprobs",
            # Defaults come from dapo's SamplingParams, never from the folder's generation_config.json.
            "generation_config": "vllm",
        }
        if join_process_group:
            # Each torchrun rank is one worker of an engine made of consecutive ranks (tensor parallel innermost);
            # vLLM builds its groups inside the trainer's world and reads RANK / LOCAL_RANK from the environment.
            kwargs["distributed_executor_backend"] = "external_launcher"
        for name, value in (
            ("max_model_len", max_model_len),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_num_seqs", max_num_seqs),
        ):
            if value is not None:
                kwargs[name] = value
        if self.on_cpu and cpu_kvcache_space_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(cpu_kvcache_space_gb * (1 << 30))
        if self.on_cpu:
            flatten_heads_for_cpu_rotary_embedding()  # MLA's 3-D queries (module docstring)
            if dtype == "float32" and _uses_latent_attention(model_path):
                kwargs["attention_backend"] = "CPU_MLA"  # the AMX MLA backend has no fp32 weights
        if lora_config is not None:
            self._adapter = VLLMAdapterSlot(lora_config)
            kwargs.update(self._adapter.engine_kwargs())

        # Process-wide state vLLM changes while starting in this process (module docstring, "CPU settings"). Its
        # worker also seeds random, numpy and torch with `seed`: here those are the trainer's RNGs, so they are put
        # back too, and building the engine does not move the trainer's random streams.
        set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
        ld_preload = os.environ.get("LD_PRELOAD")
        rng_states = _process_rng_states()
        started = time.perf_counter()
        try:
            llm = vllm.LLM(**kwargs)
        except RuntimeError as e:
            message = explain_stale_cpu_shm(e)
            if message is None:
                raise
            raise EngineUnavailableError(message) from None
        finally:
            torch.set_num_threads = set_num_threads
            if torch.get_num_threads() != num_threads:
                torch.set_num_threads(num_threads)
            if self._in_process:
                _restore_process_rng_states(rng_states)
            if self._in_process:
                if ld_preload is None:
                    os.environ.pop("LD_PRELOAD", None)
                else:
                    os.environ["LD_PRELOAD"] = ld_preload
        self.startup_seconds = time.perf_counter() - started
        self._vllm = vllm
        self._llm = llm
        model_config = llm.llm_engine.model_config
        self.vocab_size: int = int(model_config.get_vocab_size())
        self.max_model_len: int = int(model_config.max_model_len)
        for token_id in self.eos_token_ids:
            if token_id >= self.vocab_size:
                self.close()
                raise ValueError(f"VLLMRolloutEngine: eos token id {token_id} is outside the vocabulary")
        self._asleep: set[str] = set()  # memory kinds ("weights", "kv_cache") released by sleep mode
        # Which checkpoint tensors share a vLLM layer (q/k/v -> qkv_proj, gate/up -> gate_up_proj, weight + bias):
        # update_weights refuses a push that covers only part of a layer (see there).
        packed = llm.apply_model(_packed_modules_of)[0]
        self._shard_to_fused = {part: fused for fused, parts in packed.items() for part in parts}
        self._checkpoint_layers = _checkpoint_layers(str(model_path), packed)
        self._tied_embeddings = bool(getattr(model_config.hf_config, "tie_word_embeddings", False))
        logger.info(
            "VLLMRolloutEngine: vllm %s on %s, %s, started in %.1f s",
            vllm.__version__,
            current_platform.device_name,
            dtype,
            self.startup_seconds,
        )

    # ------------------------------------------------------------------------------------------------ public API
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        """Sample ``params.n`` responses for each prompt; one entry per sample, each prompt's samples contiguous."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"VLLMRolloutEngine.generate: params must be SamplingParams, got {type(params).__name__}")
        llm = self._require_open("generate")
        if 0 < params.temperature < _VLLM_MIN_TEMPERATURE:
            raise ValueError(
                f"VLLMRolloutEngine.generate: temperature {params.temperature} is below vLLM's minimum "
                f"{_VLLM_MIN_TEMPERATURE} (vLLM would sample at {_VLLM_MIN_TEMPERATURE} and report log-probs there); "
                "use 0 for greedy decoding"
            )
        prompts = self._validate_prompts(prompt_token_ids, "generate")
        for index, prompt in enumerate(prompts):
            if len(prompt) + params.max_tokens > self.max_model_len:
                raise ValueError(
                    f"VLLMRolloutEngine.generate: prompt {index} has {len(prompt)} tokens; with max_tokens="
                    f"{params.max_tokens} that exceeds max_model_len={self.max_model_len} (vLLM would stop early)"
                )
        stop_ids = frozenset(self.eos_token_ids) | frozenset(params.stop_token_ids)
        greedy = params.greedy
        draws = 1 if greedy else params.n  # vLLM refuses n > 1 with greedy decoding; the draws would be equal anyway
        request = self._vllm.SamplingParams(
            n=draws,
            temperature=float(params.temperature),
            top_p=1.0 if greedy else float(params.top_p),
            top_k=0 if greedy or params.top_k <= 0 else params.top_k,
            max_tokens=params.max_tokens,
            stop_token_ids=sorted(stop_ids),
            ignore_eos=True,  # the stop set is exactly stop_token_ids (module docstring, "Termination")
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,
            skip_special_tokens=False,
        )
        self._wake()
        with self._seeded(params.seed):
            results = llm.generate(
                self._token_prompts(prompts), request, use_tqdm=False, lora_request=self._lora_request()
            )
        if self.free_cache_engine:
            llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}

        prompt_index: list[int] = []
        response_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        finish_reason: list[str] = []
        for index, result in enumerate(results):
            completions = sorted(result.outputs, key=lambda completion: completion.index)
            if len(completions) != draws:
                raise RuntimeError(f"vLLM returned {len(completions)} samples for prompt {index}, expected {draws}")
            for completion in completions:
                ids, lps, reason = self._read_completion(completion, stop_ids, params.max_tokens, index)
                for _ in range(params.n // draws):
                    prompt_index.append(index)
                    response_ids.append(list(ids))
                    logprobs.append(list(lps))
                    finish_reason.append(reason)
        return RolloutOutput(prompt_index, response_ids, logprobs, finish_reason)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors (the actor's ``named_parameters()``) into the running model, then reset the
        prefix cache.

        A subset is fine as long as it holds whole vLLM layers: vLLM's layerwise reload keeps the weights of layers not
        named, but processes a layer given only in part with the rest *uninitialised* (e.g. ``q_proj`` without
        ``k_proj``/``v_proj``, or a weight without its bias). Such a push raises ``ValueError`` before anything is
        loaded, and so does a name the checkpoint does not have (``KeyError``).
        """
        llm = self._require_open("update_weights")
        if self._adapter is not None:  # a LoRA actor pushes its adapter; the base weights stay those loaded at start
            self._wake(("weights",))
            self._adapter.push(llm, named_tensors)
            if not llm.reset_prefix_cache():
                raise RuntimeError("VLLMRolloutEngine.update_weights: vLLM could not reset its prefix cache")
            return

        def pushed(name: str) -> bool:
            # A tied lm_head is the embedding (named_parameters(remove_duplicate=False) lists it); vLLM skips it too.
            return not (self._tied_embeddings and name.startswith("lm_head."))

        weights: Iterable[tuple[str, torch.Tensor]]
        if isinstance(named_tensors, WeightStream) and self._in_process:
            # Checked on the announced names, then loaded as the tensors come: one gathered tensor at a time.
            self._check_whole_layers([name for name in named_tensors.names if pushed(name)])
            weights = ((name, tensor.detach()) for name, tensor in named_tensors if pushed(name))
        else:  # a worker in another process receives the list serialised
            weights = [(name, tensor.detach()) for name, tensor in named_tensors if pushed(name)]  # references
            self._check_whole_layers([name for name, _ in weights])
        self._wake(("weights",))
        benign = frozenset({"RotaryEmbedding", "ParallelLMHead"} if self._tied_embeddings else {"RotaryEmbedding"})
        quiet = _BenignReloadWarnings(benign)
        reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        reload_logger.addFilter(quiet)
        try:
            llm.collective_rpc(_reload_weights_on_worker, args=(weights,))
        finally:
            reload_logger.removeFilter(quiet)
        if not llm.reset_prefix_cache():
            raise RuntimeError("VLLMRolloutEngine.update_weights: vLLM could not reset its prefix cache")

    def log_probs_of(self, prompt_token_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """Teacher-forced log-probs of ``response_ids`` after the prompt (temperature 1, full vocabulary)."""
        llm = self._require_open("log_probs_of")
        prompt = self._validate_prompts([prompt_token_ids], "log_probs_of")[0]
        response = self._validate_ids(response_ids, "log_probs_of: response")
        if not response:
            return []
        sequence = prompt + response
        if len(sequence) + 1 > self.max_model_len:
            raise ValueError(
                f"VLLMRolloutEngine.log_probs_of: prompt + response is {len(sequence)} tokens; vLLM needs room for one "
                f"more (max_model_len={self.max_model_len}); build the engine with a larger max_model_len"
            )
        # Greedy, one token: prompt log-probs come from the raw logits, and greedy decoding draws no random numbers,
        # so the probe does not move the sampling RNG.
        request = self._vllm.SamplingParams(
            n=1, temperature=0.0, max_tokens=1, prompt_logprobs=0, ignore_eos=True, detokenize=False
        )
        self._wake()
        result = llm.generate(
            self._token_prompts([sequence]), request, use_tqdm=False, lora_request=self._lora_request()
        )[0]
        scores = result.prompt_logprobs
        if scores is None or len(scores) != len(sequence):
            raise RuntimeError("VLLMRolloutEngine.log_probs_of: vLLM returned no prompt log-probs")
        return [float(scores[len(prompt) + t][token].logprob) for t, token in enumerate(response)]

    def close(self) -> None:
        """Shut the engine core down and free its memory. Idempotent."""
        llm, self._llm = self._llm, None
        if self._adapter is not None:
            self._adapter.close()
        if llm is None:
            return
        try:
            # No public LLM.shutdown() in vLLM 0.32; the engine-core client's shutdown also undoes vLLM's gc.freeze()
            # and tears down the (single-process) torch.distributed group, so that another engine can start here.
            # Under torchrun that group is the trainer's: vLLM's own groups go, the default group stays.
            with _keeping_default_process_group(self.joined_process_group):
                llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def __enter__(self) -> VLLMRolloutEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------ internals
    def _lora_request(self) -> Any:
        """The adapter of the last push (None: no LoRA, or none pushed yet: the base model)."""
        return None if self._adapter is None else self._adapter.request

    def _require_open(self, method: str) -> Any:
        if self._llm is None:
            raise RuntimeError(f"VLLMRolloutEngine.{method}: the engine is closed")
        return self._llm

    def _check_whole_layers(self, names: list[str]) -> None:
        if self._checkpoint_layers is None:
            return
        given = set(names)
        known = frozenset().union(*self._checkpoint_layers.values())
        unknown = sorted(given - known)
        if unknown:
            # Checked up front: vLLM raises in the middle of a reload, with the layers before it already replaced.
            raise KeyError(f"VLLMRolloutEngine.update_weights: the checkpoint has no tensor {unknown[0]!r}")
        for key in sorted({_layer_key(name, self._shard_to_fused) for name in given}):
            missing = self._checkpoint_layers[key] - given
            if missing:
                raise ValueError(
                    f"VLLMRolloutEngine.update_weights: vLLM layer {key!r} would be loaded in part (missing "
                    f"{sorted(missing)}); vLLM would leave the rest of it uninitialised. Push whole layers, e.g. all "
                    "of named_parameters()"
                )

    def _wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Bring back what sleep mode released (all of it, or just ``tags``)."""
        wanted = self._asleep if tags is None else self._asleep & set(tags)
        if wanted:
            if torch.cuda.is_available():
                # The blocks the actor freed are still held by torch's caching allocator, which vLLM's allocator
                # cannot reuse: without this the wake-up can run out of memory on a device that has room.
                torch.cuda.empty_cache()
            self._llm.wake_up(tags=sorted(wanted))
            self._asleep -= wanted

    @contextlib.contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """With a seed: make the sampling draws a function of the seed alone (module docstring, "Seeds")."""
        if seed is None:
            yield
            return
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            # Prefix-cache hits change which requests fit in each engine step, hence which random draw each row gets.
            self._llm.reset_prefix_cache()
            self._llm.collective_rpc(_seed_worker_rng, args=(seed,))
            yield

    def _token_prompts(self, prompts: list[list[int]]) -> list[Any]:
        from vllm.inputs import TokensPrompt

        return [TokensPrompt(prompt_token_ids=prompt) for prompt in prompts]

    def _validate_ids(self, ids: object, what: str) -> list[int]:
        """A 1-D sequence of in-vocabulary token ids as a list of ints (may be empty)."""
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"VLLMRolloutEngine.{what} must be a sequence of token ids, got {type(ids).__name__}")
        tensor = torch.as_tensor(ids if isinstance(ids, torch.Tensor) else list(ids))  # type: ignore[call-overload]
        if tensor.numel() == 0:
            return []
        if tensor.dim() != 1:
            raise ValueError(f"VLLMRolloutEngine.{what} must be 1-D, got shape {tuple(tensor.shape)}")
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
            raise ValueError(f"VLLMRolloutEngine.{what} has non-integer token ids ({tensor.dtype})")
        low, high = int(tensor.min()), int(tensor.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"VLLMRolloutEngine.{what} has token id {bad} outside the vocabulary [0, {self.vocab_size})"
            )
        return [int(t) for t in tensor.tolist()]

    def _validate_prompts(self, prompt_token_ids: Sequence[Sequence[int]], method: str) -> list[list[int]]:
        if isinstance(prompt_token_ids, (torch.Tensor, str, bytes)):
            raise TypeError(f"VLLMRolloutEngine.{method}: prompt_token_ids must be a sequence of token-id sequences")
        prompts = []
        for index, prompt in enumerate(prompt_token_ids):
            ids = self._validate_ids(prompt, f"{method}: prompt {index}")
            if not ids:
                raise ValueError(f"VLLMRolloutEngine.{method}: prompt {index} must be a non-empty token-id sequence")
            prompts.append(ids)
        return prompts

    @staticmethod
    def _read_completion(
        completion: Any, stop_ids: frozenset[int], max_tokens: int, prompt: int
    ) -> tuple[list[int], list[float], str]:
        """Token ids, sampled-token log-probs and dapo's finish reason of one vLLM completion, checked."""
        ids = [int(t) for t in completion.token_ids]
        if completion.logprobs is None or len(completion.logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned no per-token log-probs for a sample of prompt {prompt}")
        lps = [float(position[token].logprob) for position, token in zip(completion.logprobs, ids)]
        if ids and ids[-1] in stop_ids:
            reason = "stop"
        elif len(ids) == max_tokens:
            reason = "length"
        else:
            raise RuntimeError(
                f"vLLM ended a sample of prompt {prompt} after {len(ids)} of {max_tokens} tokens without a stop token "
                f"(finish_reason={completion.finish_reason!r})"
            )
        if any(t in stop_ids for t in ids[:-1]):
            raise RuntimeError(f"vLLM kept generating past a stop token in a sample of prompt {prompt}")
        return ids, lps, reason


def engine_lora_config(model: torch.nn.Module) -> dict | None:
    """A LoRA actor's adapter config, for vLLM to run the adapter natively; None for full fine-tuning."""
    from dapo.model.lora import adapter_config, is_lora

    return adapter_config(model) if is_lora(model) else None


def build_vllm_engine(spec: EngineSpec, policy: Policy, module: torch.nn.Module | None) -> VLLMRolloutEngine:
    """The registry's builder (``dapo.rollout.factory.ENGINES["vllm"]``): vLLM over the policy's Hugging Face folder,
    ``spec.dtype`` already resolved by the factory. ``module`` is not used: vLLM holds its own copy of the weights."""
    if policy.hf_dir is None:
        raise EngineUnavailableError(
            "rollout.name=vllm needs the policy as a Hugging Face folder; a GGUF model is converted to one when "
            "model.save_pretrained_cache=true"
        )
    return VLLMRolloutEngine(
        str(policy.hf_dir), spec, eos_token_ids=policy.eos_token_ids, lora_config=engine_lora_config(policy.model)
    )
