"""Model FLOPs of a decoder-only transformer's work, and the peak FLOP/s to hold them against (MFU).

The FLOP model (one formula for generation and training)
-------------------------------------------------------
Counted are the matrix multiplications, at 2 FLOPs per multiply-add; norms, activations, softmax, RoPE and biases are
left out (under 1 % here), as in every published accounting.

* Linear layers: ``2 * N`` FLOPs per token through the model (Kaplan et al. 2020, Sec. 2.1), where ``N`` counts the
  weights a token is multiplied with: per layer q, k, v, o projections (``h * (H*d + 2*K*d) + H*d * h``) and the gated
  MLP (``3 * h * i``), plus the LM head (``V * h``). The input embedding is a lookup, not a matmul, and is not counted
  (Chinchilla, Hoffmann et al. 2022, App. F, counts it; PaLM counts none of it as separate compute).
* Attention: a query that sees ``c`` keys costs ``4 * d * c`` FLOPs per head and layer (``Q K^T`` and ``A V``, each
  ``2 * d * c``), i.e. ``4 * L * H * d * c`` per token. A causal model's query at position ``j`` sees ``j`` keys, so a
  sequence of ``s`` tokens costs ``4 * L * H * d * s(s+1)/2``. PaLM (Chowdhery et al. 2022, App. B: ``6N + 12 L H Q T``
  per token) and verl's ``perf/mfu/actor`` count the full ``s x s`` score matrix, twice the causal half counted here.
* Training: forward plus backward = 3 x forward (the backward pass costs twice the forward; Kaplan et al. 2020,
  Chinchilla App. F): ``6 N`` per token plus ``3 x`` the attention term. Recomputation under gradient checkpointing is
  not counted: these are model FLOPs (PaLM's MFU), not hardware FLOPs.
* A group of ``n`` responses to one prompt of ``p`` tokens is counted as the work the group needs: the prompt once
  (``p`` tokens, causal) and each response's tokens once, each attending over the prompt and the tokens before it.
  This is what an engine with a shared prompt cache (or the actor's ``shared_prompt`` layout) does; an engine that
  prefills the prompt once per sample does more work than counted, which lowers its MFU, as redundant work should.
  (verl counts every sample's prompt again, so its MFU for the same job reads higher.)

Generation is counted with the same forward formula: decoding token ``j`` is one forward of that token over its
``j``-token context, so summing over the tokens gives the causal sequence formula (the last sampled token is counted
as if fed back, one token per response).

The peak
--------
A GPU's peak comes from its datasheet (dense, no sparsity; bf16 on the tensor cores, fp32 on the CUDA cores, since
PyTorch runs fp32 matmuls without TF32 by default). Anything else (a CPU, a GPU not in the table) gets its peak
measured once by a short matmul probe, cached in ``$XDG_CACHE_HOME/dapo/peak_flops.json`` (``~/.cache/dapo``): MFU is
then relative to the best dense matmul rate this machine reaches, not to a datasheet. A CPU probe taken while the
1-minute load average exceeds the cores is used for that run but not cached (a contended figure would otherwise stay
the reference and later steps would read MFU above 1); delete the file to measure again. The probe keeps the best of
several timed matmuls (a preempted one only looks slow), and an MFU that still comes out above 1 (the probe ran under
load, so its peak is below the machine's: up to 280 % was seen) is reported as 1 with one warning per run.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from dapo.infra.atomic import atomic_write

__all__ = [
    "GPU_PEAK_TFLOPS",
    "PeakFlops",
    "TransformerShape",
    "attention_flops_per_key",
    "group_forward_flops",
    "matmul_params",
    "measure_matmul_flops",
    "mfu",
    "peak_flops",
    "sequence_forward_flops",
]


class TransformerShape(Protocol):
    """The config.json values the count needs (a ``transformers`` config or ``dapo.distributed.layout.ModelShape``)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int


def _head_dim(shape: TransformerShape) -> int:
    head_dim = getattr(shape, "head_dim", None)
    return int(head_dim) if head_dim else shape.hidden_size // shape.num_attention_heads


def _kv_heads(shape: TransformerShape) -> int:
    return int(getattr(shape, "num_key_value_heads", None) or shape.num_attention_heads)


def _mlp_width(shape: TransformerShape) -> int:
    """The gated MLP's inner width a token goes through. A MoE config without a dense ``intermediate_size``
    (Qwen3.5-MoE) counts the experts a token is routed to and the shared expert: ``k * moe_intermediate_size +
    shared_expert_intermediate_size``. (MoE configs that also name a dense width are counted dense, an upper bound;
    linear-attention and MLA layers are counted as standard attention: the figure is an estimate for those families.)
    """
    width = getattr(shape, "intermediate_size", None)
    if width:
        return int(width)
    routed = int(getattr(shape, "num_experts_per_tok", 0) or 0) * int(getattr(shape, "moe_intermediate_size", 0) or 0)
    return routed + int(getattr(shape, "shared_expert_intermediate_size", 0) or 0)


def matmul_params(shape: TransformerShape) -> int:
    """``N``: the weights one token is multiplied with (attention projections, gated MLP, LM head; no embedding)."""
    h, d = shape.hidden_size, _head_dim(shape)
    q, kv = shape.num_attention_heads * d, _kv_heads(shape) * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * _mlp_width(shape)
    return shape.num_hidden_layers * per_layer + shape.vocab_size * h


def attention_flops_per_key(shape: TransformerShape) -> int:
    """Forward FLOPs of one (query, key) pair over all layers and heads: ``4 * L * H * d``."""
    return 4 * shape.num_hidden_layers * shape.num_attention_heads * _head_dim(shape)


def _causal_pairs(start: int, stop: int) -> int:
    """Query-key pairs of the queries at positions start+1 .. stop (1-based) of a causal sequence: sum of j."""
    return (stop * (stop + 1) - start * (start + 1)) // 2


def group_forward_flops(shape: TransformerShape, prompt_len: int, response_lens: Sequence[int]) -> int:
    """Forward FLOPs of a prompt (once) and its responses (each attending over the prompt and its own prefix)."""
    tokens = prompt_len + sum(response_lens)
    pairs = _causal_pairs(0, prompt_len) + sum(_causal_pairs(prompt_len, prompt_len + r) for r in response_lens)
    return 2 * matmul_params(shape) * tokens + attention_flops_per_key(shape) * pairs


def sequence_forward_flops(shape: TransformerShape, length: int) -> int:
    """Forward FLOPs of one causal sequence: ``2 N s + 4 L H d s(s+1)/2``."""
    return group_forward_flops(shape, length, [])


# Dense datasheet peaks in TFLOP/s (bf16 tensor core without sparsity; fp32 on CUDA cores, TF32 off as PyTorch's
# default). Matched against torch.cuda.get_device_name() in this order (the first name contained wins).
GPU_PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756.0, "fp32": 51.2}),  # NVIDIA H100 datasheet, PCIe
    ("H100 NVL", {"bf16": 835.0, "fp32": 60.0}),  # H100 NVL
    ("H100", {"bf16": 989.4, "fp32": 66.9}),  # H100 SXM5
    ("H200", {"bf16": 989.4, "fp32": 66.9}),  # H200 SXM: H100's compute, more memory
    ("A100", {"bf16": 312.0, "fp32": 19.5}),  # A100 SXM / PCIe, 40 and 80 GB
    ("L40S", {"bf16": 362.05, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp32": 30.3}),
    ("A10G", {"bf16": 70.0, "fp32": 31.2}),  # AWS A10G (not NVIDIA's A10)
    ("A10", {"bf16": 125.0, "fp32": 31.2}),
    ("RTX 4090", {"bf16": 165.2, "fp32": 82.6}),  # bf16 with fp32 accumulation
    ("V100", {"fp32": 15.7}),  # no bf16 tensor cores
)


@dataclass(frozen=True)
class PeakFlops:
    """FLOP/s of one device at ``dtype`` and where the figure comes from (``datasheet: H100`` or ``measured ...``)."""

    flops_per_s: float
    dtype: str
    source: str


def datasheet_peak(device_name: str, dtype: str) -> PeakFlops | None:
    for name, peaks in GPU_PEAK_TFLOPS:
        if name.lower() in device_name.lower():
            if dtype in peaks:
                return PeakFlops(peaks[dtype] * 1e12, dtype, f"datasheet: {name} {dtype}")
            return None
    return None


_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}  # torch is imported on use: the CLI lists GPUs without it


log = logging.getLogger(__name__)
_warned_mfu_above_one = False


def mfu(achieved: float, peak: PeakFlops) -> float:
    """``achieved / peak``, at most 1: achieving more than the peak means the peak is wrong (a probe taken under load
    measured contention), so the ratio is clamped and the first clamp of the process says why in one warning."""
    global _warned_mfu_above_one
    ratio = achieved / peak.flops_per_s
    if ratio > 1.0:
        if not _warned_mfu_above_one:
            _warned_mfu_above_one = True
            log.warning(
                "MFU %.0f%% is above 100%%: the peak (%s, %.3g FLOP/s) underestimates this device, probably "
                "probed under load; MFU is reported as 1 (delete the peak cache to probe again)",
                100 * ratio,
                peak.source,
                peak.flops_per_s,
            )
        return 1.0
    return ratio


def measure_matmul_flops(device: torch.device, dtype: str, *, size: int | None = None, repeats: int = 7) -> float:
    """The best FLOP/s of ``repeats`` square matmuls on ``device`` (deterministic inputs: the global RNG is untouched,
    so a probe never changes a seeded run)."""
    import torch

    size = size or (4096 if device.type == "cuda" else 768)  # ~0.1 s on one CPU core: paid once per machine
    a = torch.linspace(-1.0, 1.0, size * size, device=device).reshape(size, size).to(getattr(torch, _DTYPES[dtype]))
    b = a.t().contiguous()
    best = float("inf")
    torch.matmul(a, b)  # warm-up: kernel selection, allocation
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / max(best, 1e-12)


def cpu_name() -> str:
    """The CPU's model name (the peak cache's key; benchmarks record it beside their figures)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dapo" / "peak_flops.json"


def peak_flops(device: torch.device, dtype: str, *, cache: Path | None = None) -> PeakFlops:
    """The peak of one ``device`` at ``dtype`` ("bf16" or "fp32"): the datasheet's, else a probe's, measured once per
    machine, device, dtype, torch version and thread count and cached in ``cache`` (default :func:`cache_file`)."""
    import torch

    name = device_name(device)
    known = datasheet_peak(name, dtype) if device.type == "cuda" else None
    if known is not None:
        return known
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    key = f"{device.type}|{name}|{dtype}|torch {torch.__version__}|threads {threads}"
    path = cache if cache is not None else cache_file()
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError):
        table = {}
    value = table.get(key)
    note = ""
    if not isinstance(value, (int, float)) or value <= 0:
        value = measure_matmul_flops(device, dtype)
        if device.type == "cpu" and _cpu_busy():
            # other processes held the cores: the figure is far below the machine's and would stay cached (MFU above
            # 1 later); this run uses it, the next one measures again
            note = ", not cached: the CPU was busy"
        else:
            table[key] = value
            try:
                atomic_write(path, json.dumps(table, indent=1, sort_keys=True))
            except OSError:  # an unwritable cache costs a probe per run, nothing else
                pass
    threads_note = f", {threads} threads" if threads else ""
    return PeakFlops(float(value), dtype, f"measured: {dtype} matmul probe on {name}{threads_note} ({path}{note})")


def _cpu_busy() -> bool:
    """Whether runnable processes outnumber the cores (the 1-minute load average), so a probe measures contention."""
    try:
        return os.getloadavg()[0] > (os.cpu_count() or 1)
    except OSError:
        return False
