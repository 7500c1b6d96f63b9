"""The compute section of `dapo explain`: a step's model FLOPs (the FLOP model of ``dapo.infra.perf``, the one the
``perf/*`` metrics of `dapo train` use) and the time they take on the declared GPUs at a given MFU."""

from __future__ import annotations

from dapo.infra.perf import GPU_PEAK_TFLOPS, datasheet_peak, group_forward_flops
from dapo.rollout.factory import engine_capabilities

GPU_NAMES = tuple(name for name, _ in GPU_PEAK_TFLOPS)


def _flops(x: float) -> str:
    for unit, div in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if x >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x / 1e6:.2f} MFLOP"


def _rollout_precision(cfg, actor_precision: str) -> str:
    """The precision the engine generates in on a GPU: ``rollout.dtype``, with ``auto`` as the engine's capabilities
    resolve it on ``cuda`` (vLLM: bfloat16; the Transformers engine: the actor's)."""
    dtype = cfg.rollout.dtype
    if dtype == "auto":
        auto = engine_capabilities(cfg.rollout.name).auto_dtype
        if auto is None:
            return actor_precision
        dtype = auto["cuda"]
    return "fp32" if dtype == "float32" else "bf16"


def compute_lines(layout, cfg, gpu: str, mfu: float) -> list[str]:
    """Rows for the expected step of ``layout`` (mean prompt / response tokens, expected rounds) on ``gpu``."""
    m = layout.model
    if m is None:
        return ["compute: unknown model size (see above)"]
    p, r, n = layout.mean_prompt_tokens, layout.mean_response_tokens, layout.n
    group = group_forward_flops(m, p, [r] * n)  # one prompt once, n responses of the mean length
    gen = layout.expected_rounds * layout.gen_batch_size * group
    train = cfg.actor.ppo_epochs * layout.prompts_per_step * 3 * group
    actor_precision = cfg.actor.dtype
    rollout_precision = _rollout_precision(cfg, actor_precision)
    out = [
        "",
        "compute per step (model FLOPs: 2 N per token + causal attention, training = 3 x forward; docs/performance.md)",
    ]

    def row(label: str, value: str) -> None:
        out.append(f"  {label:<52} {value}")

    row(
        "generation (rounds x gen batch x groups)",
        f"{_flops(gen)} = {layout.expected_rounds} x "
        f"{layout.gen_batch_size} x {_flops(group)} (prompt {p} once + {n} x {r} response tokens)",
    )
    row(
        "actor update (ppo_epochs x train batch, fwd + bwd)",
        f"{_flops(train)} = {cfg.actor.ppo_epochs} x {layout.prompts_per_step} x 3 x {_flops(group)}",
    )
    world = layout.world_size
    for phase, flops, precision in (("generation", gen, rollout_precision), ("actor update", train, actor_precision)):
        peak = datasheet_peak(gpu, precision)
        if peak is None:
            row(f"{phase} on {world} x {gpu} ({precision})", "no datasheet peak for this precision")
            continue
        ideal = flops / (world * peak.flops_per_s)
        row(
            f"{phase} on {world} x {gpu} ({precision}, {peak.flops_per_s / 1e12:g} TFLOP/s each)",
            f"{ideal:.3g} s at 100% MFU, {ideal / mfu:.3g} s at {100 * mfu:g}% MFU (--mfu)",
        )
    out.append(
        "    decoding one token per sequence is memory-bound: generation's MFU is usually far below the update's"
    )
    return out
