"""`dapo explain`: the effective layout of one training step of a config on a world of ranks, and what it costs.

The arithmetic is ``dapo.distributed.layout`` (pure); this module only finds the model's config.json values (a local
folder, the local Hugging Face cache, or the built-in table; never the network), renders, and turns an inconsistent
config into exit status 2 with the keys named.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from dapo.cli.explain_compute import GPU_NAMES, compute_lines
from dapo.config import ConfigError, load_config
from dapo.rollout.factory import engine_capabilities


class _Refused(click.ClickException):
    exit_code = 2


@click.command("explain", context_settings={"ignore_unknown_options": True})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    multiple=True,
    help="YAML config (see configs/); repeat it to merge several in order (later files win, key by key); "
    "defaults: the embedded tiny model's run.",
)
@click.option("--nnodes", type=int, default=1, show_default=True, help="Nodes (torchrun --nnodes).")
@click.option(
    "--nproc-per-node",
    type=int,
    default=1,
    show_default=True,
    help="Ranks (GPUs) per node (torchrun --nproc-per-node).",
)
@click.option(
    "--informative-fraction",
    type=float,
    default=0.5,
    show_default=True,
    help="Assumed share of prompt groups dynamic sampling keeps (measure it: train/num_gen_batches).",
)
@click.option("--prompt-tokens", type=int, default=None, help="Assumed mean prompt tokens [max_prompt_length / 2].")
@click.option(
    "--response-tokens", type=int, default=None, help="Assumed mean response tokens [max_response_length / 2]."
)
@click.option("--gpu-memory-gib", type=float, default=80.0, show_default=True, help="Memory of one GPU.")
@click.option(
    "--model-config",
    type=click.Path(exists=True),
    default=None,
    help="A config.json (or a folder holding one) to size the model from, instead of model.path.",
)
@click.option(
    "--gpu",
    type=click.Choice(GPU_NAMES, case_sensitive=False),
    default="H100",
    show_default=True,
    help="GPU whose datasheet peak the compute section uses (dapo.infra.perf).",
)
@click.option(
    "--mfu",
    type=click.FloatRange(0.0, 1.0, min_open=True),
    default=0.4,
    show_default=True,
    help="Model FLOPs utilization assumed for the step-time estimate.",
)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def explain_command(
    config_path: tuple[str, ...],
    nnodes: int,
    nproc_per_node: int,
    informative_fraction: float,
    prompt_tokens: int | None,
    response_tokens: int | None,
    gpu_memory_gib: float,
    model_config: str | None,
    gpu: str,
    mfu: float,
    overrides: tuple[str, ...],
) -> None:
    """Print the layout of a training step: batches, rounds, optimizer steps, micro-batches, memory per GPU.

    OVERRIDES are dotted keys, as for `dapo train`. An inconsistent config exits with status 2, naming the keys.
    """
    from dapo.distributed.layout import Assumptions, LayoutError, compute_layout

    try:
        cfg = load_config(config_path or None, overrides)
    except ConfigError as exc:
        raise _Refused(str(exc)) from None
    for name, value in (("--prompt-tokens", prompt_tokens), ("--response-tokens", response_tokens)):
        if value is not None and value < 1:
            raise _Refused(f"{name} must be >= 1, got {value}")
    if gpu_memory_gib <= 0:
        raise _Refused(f"--gpu-memory-gib must be > 0, got {gpu_memory_gib}")
    model, model_note = resolve_model_shape(cfg, model_config)
    assumptions = Assumptions(
        informative_fraction=informative_fraction,
        mean_prompt_tokens=prompt_tokens,
        mean_response_tokens=response_tokens,
        gpu_memory_gib=gpu_memory_gib,
    )
    try:
        layout = compute_layout(
            cfg,
            model,
            nnodes=nnodes,
            nproc_per_node=nproc_per_node,
            assumptions=assumptions,
            engine_reserves_gpu_memory=engine_capabilities(cfg.rollout.name).reserves_gpu_memory,
        )
    except LayoutError as exc:
        lines = "\n".join(f"  - {p}" for p in exc.problems)
        raise _Refused(f"this config cannot be laid out on {nnodes} x {nproc_per_node} ranks:\n{lines}") from None
    click.echo(render(layout, cfg, " + ".join(config_path) or "defaults", overrides, model_note))
    click.echo("\n".join(compute_lines(layout, cfg, gpu, mfu)))


def resolve_model_shape(cfg, model_config: str | None):  # -> tuple[ModelShape | None, str]
    """The model's shape and where it came from: --model-config, the local folder, the local HF cache, the table."""
    from dapo.distributed.layout import ModelShape, known_model_shape

    def from_file(path: Path, name: str, where: str):
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
            return ModelShape.from_hf_config(values, name=name, source=f"{where}: {path}"), ""
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _Refused(f"{path}: not a usable model config.json ({type(exc).__name__}: {exc})") from None

    if model_config is not None:
        p = Path(model_config)
        p = p / "config.json" if p.is_dir() else p
        return from_file(p, p.parent.name, "--model-config")
    if cfg.model.path is None:
        import dapo

        asset = Path(dapo.__file__).resolve().parent / "assets" / "tiny-qwen2" / "config.json"
        if asset.is_file():
            return from_file(asset, "tiny-qwen2 (embedded)", "the embedded model's config.json")
        return known_model_shape("tiny-qwen2"), ""
    path = cfg.model.path
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        return from_file(local / "config.json", local.name, "local model folder")
    cached = _hf_cache_config(path)
    if cached is not None:
        return from_file(cached, path, "local Hugging Face cache")
    for name in (path, cfg.model.gguf_file or ""):
        shape = known_model_shape(name) if name else None
        if shape is not None:
            return shape, f"({path} is not on this machine)"
    return None, (
        f"model.path {path!r} is neither a local folder with a config.json nor in the built-in table "
        "(Qwen2.5-32B, Qwen2.5-Math-7B, Qwen2.5-7B, SmolLM2-135M, the embedded tiny Qwen2); "
        "give --model-config PATH/config.json for a memory estimate"
    )


def _hf_cache_config(repo_id: str) -> Path | None:
    """config.json of a Hub id already in the local Hugging Face cache (no network), or None."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub"
    )
    snapshots = Path(hub) / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[-1] if found else None


def _gib(x: float) -> str:
    """Bytes in GiB, or MiB / KiB when smaller (the tiny model's numbers stay readable)."""
    for unit, div in (("GiB", 1024**3), ("MiB", 1024**2)):
        if x >= div or unit == "MiB" and x >= 1024:
            return f"{x / div:.1f} {unit}"
    return f"{x / 1024:.1f} KiB"


def _num(x: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:g}"


def render(layout, cfg, origin: str, overrides, model_note: str) -> str:
    """The text `dapo explain` prints."""
    lo, a, r = layout, cfg.actor, cfg.rollout
    out: list[str] = []
    add = out.append

    def row(label: str, value: str) -> None:
        add(f"  {label:<52} {value}")

    world = f"{lo.nnodes} node(s) x {lo.nproc_per_node} GPU(s) = {lo.world_size} rank(s)"
    add(f"dapo explain: {origin}{' + overrides' if overrides else ''} on {world}")
    m = lo.model
    if m is not None:
        add(
            f"model: {m.name}, {m.num_parameters / 1e9:.2f} B parameters (hidden {m.hidden_size}, intermediate "
            f"{m.intermediate_size}, {m.num_hidden_layers} layers, {m.num_attention_heads} heads, "
            f"{m.num_key_value_heads} KV heads, head dim {m.resolved_head_dim}, vocab {m.vocab_size}, "
            f"{'tied' if m.tie_word_embeddings else 'untied'} LM head)"
        )
        add(f"  from {m.source} {model_note}".rstrip())
    else:
        add(f"model: unknown size: {model_note}")
    s = lo.assumptions
    add(
        f"assumed: mean prompt {lo.mean_prompt_tokens} tokens (--prompt-tokens), mean response "
        f"{lo.mean_response_tokens} tokens (--response-tokens); defaults are half of the maxima"
    )
    if lo.dynamic_sampling:
        add(
            f"  informative fraction {s.informative_fraction:g} of groups kept by dynamic sampling "
            "(--informative-fraction; a guess, no published figure: measure train/num_gen_batches)"
        )
    add(f"  {s.gpu_memory_gib:g} GiB per GPU (--gpu-memory-gib)")
    if lo.warnings:  # before the numbers they qualify, where they are read first
        add("")
        add("warnings (they qualify the numbers below)")
        for line in lo.warnings:
            add(f"  - {line}")

    add("")
    add("step")
    row("prompts per step (data.train_batch_size)", f"{lo.prompts_per_step}")
    row(f"responses per step (x rollout.n {lo.n})", f"{lo.prompts_per_step * lo.n}")
    row(
        "generation batch (data.gen_batch_size)",
        f"{lo.gen_batch_size} prompts = {lo.gen_batch_size * lo.n} responses per round",
    )
    if lo.dynamic_sampling:
        bound = (
            f"at most {lo.max_num_gen_batches} (algorithm.filter_groups.max_num_gen_batches)"
            if lo.max_num_gen_batches > 0
            else "unlimited"
        )
        row(
            "expected generation rounds",
            f"{lo.expected_rounds} = ceil({lo.prompts_per_step} / "
            f"({lo.gen_batch_size} x {s.informative_fraction:g})), {bound}",
        )
        add(
            f"    one round suffices while >= {100 * lo.min_fraction_one_round:.1f}% of groups are informative"
            + (
                f"; the step gives up below {100 * lo.min_fraction_all_rounds:.1f}%"
                if lo.min_fraction_all_rounds is not None
                else ""
            )
        )
    else:
        add(
            "  generation rounds                                 1 (algorithm.filter_groups.enable=false: every "
            "group is trained on)"
        )
    row(
        "expected generated tokens per step",
        f"{_num(lo.expected_generated_tokens)} = "
        f"{lo.expected_rounds} round(s) x {lo.gen_batch_size * lo.n} responses x {lo.mean_response_tokens}",
    )
    row(
        "optimizer steps per rollout step",
        f"{lo.optimizer_steps} = actor.ppo_epochs {a.ppo_epochs} "
        f"x {lo.prompts_per_step} / actor.ppo_mini_batch_size {a.ppo_mini_batch_size}",
    )

    add("")
    add("ranks")
    row("actor data-parallel ranks (FSDP over the world)", f"{lo.actor_ranks}")
    row(
        f"vLLM engines (world / rollout.tensor_model_parallel_size {lo.rollout_tp})",
        f"{lo.rollout_engines}, "
        f"each generating {lo.prompts_per_engine_round} prompts = {lo.prompts_per_engine_round * lo.n} responses "
        "per round",
    )
    row("per rank per step", f"{lo.prompts_per_rank_step:g} prompts = {lo.samples_per_rank_step:g} samples")
    row(
        "per rank per mini-batch",
        f"{lo.samples_per_rank_mini_batch} samples ({lo.mini_batch_groups} prompts x {lo.n} / {lo.world_size} ranks)",
    )
    if lo.token_budget is not None:
        per_sample = lo.mean_prompt_tokens + lo.mean_response_tokens
        row(
            "micro-batches per rank per mini-batch",
            f"{lo.expected_micro_batches} expected = "
            f"ceil({lo.samples_per_rank_mini_batch} x {per_sample} tokens / {lo.token_budget}), "
            f"{lo.max_micro_batches} at most (every sample at {lo.max_sample_tokens} tokens)",
        )
        row(
            "token bound per micro-batch",
            f"{lo.token_bound} "
            + (
                "(actor.ppo_max_token_len_per_gpu)"
                if lo.token_bound == lo.token_budget
                else "(one full-length sample, above actor.ppo_max_token_len_per_gpu)"
            ),
        )
    else:
        row(
            "micro-batches per rank per mini-batch",
            f"{lo.expected_micro_batches} (actor.ppo_micro_batch_size_per_gpu {a.ppo_micro_batch_size_per_gpu})",
        )
        row(
            "token bound per micro-batch",
            f"{lo.token_bound} ({a.ppo_micro_batch_size_per_gpu} x {lo.max_sample_tokens})",
        )

    mem = lo.memory
    if mem is not None:
        w = mem.world_size
        add("")
        precision = "autocasts to bf16" if a.dtype == "bf16" else "computes in fp32"
        add(f"memory per GPU (estimates; the actor keeps fp32 master weights and {precision})")
        row(
            "parameters (fp32, 4 B each)",
            f"{_gib(mem.param_bytes / w)} sharded over {w}  | {_gib(mem.param_bytes)} unsharded",
        )
        row("gradients (fp32)", f"{_gib(mem.grad_bytes / w)} sharded  | {_gib(mem.grad_bytes)} unsharded")
        row(
            "optimizer (AdamW m and v, fp32)",
            f"{_gib(mem.optim_bytes / w)} sharded  | {_gib(mem.optim_bytes)} unsharded",
        )
        if w > 1:
            row("FSDP all-gathered layer (fp32, x2 prefetch)", f"{_gib(mem.gathered_layer_bytes)}")
        row(
            f"activations, one micro-batch of {mem.act_tokens} tokens",
            f"{_gib(mem.act_ckpt_bytes)} with gradient checkpointing | {_gib(mem.act_no_ckpt_bytes)} without "
            f"(actor.gradient_checkpointing={'true' if mem.gradient_checkpointing else 'false'})",
        )
        if m is not None:
            act_b = 2 if a.dtype == "bf16" else 4
            add(
                f"    = layers x tokens x {act_b} B x (4h + 3q + 3kv + 4i) without; layers x tokens x h x {act_b} B "
                "+ one layer's share with (h hidden, q = heads x head dim, kv = KV heads x head dim, i intermediate)"
            )
        row(
            f"logits chunk (actor.logprob_chunk_size {a.logprob_chunk_size} x vocab)", f"{_gib(mem.logits_chunk_bytes)}"
        )
        row("actor training phase (states + layer + activations + logits)", f"{_gib(mem.actor_peak_bytes)}")
        if engine_capabilities(r.name).reserves_gpu_memory:
            full = lo.max_sample_tokens
            row(f"vLLM weights (bf16 / tensor parallel {lo.rollout_tp})", f"{_gib(mem.vllm_weight_bytes)}")
            row(
                "vLLM KV cache per token",
                f"{mem.kv_bytes_per_token / 1024:.1f} KiB = 2 x {m.num_hidden_layers} "
                f"layers x {m.num_key_value_heads} KV heads x head dim {m.resolved_head_dim} x 2 B / tensor parallel "
                f"{lo.rollout_tp}",
            )
            row(
                f"KV cache for {mem.kv_sequences} sequences of {full} tokens",
                f"{_gib(mem.kv_bytes)} ({mem.kv_sequences_from}; vLLM schedules what its KV room holds)",
            )
            row(
                f"vLLM reservation (gpu_memory_utilization {r.gpu_memory_utilization})",
                f"{_gib(mem.vllm_reserved_bytes)} of {s.gpu_memory_gib:g} GiB: KV room "
                f"{_gib(max(0, mem.kv_room_bytes))} = {mem.kv_room_tokens} tokens = {mem.kv_room_tokens // full} "
                "full-length sequences at once",
            )
            sleeps = (
                "true: vLLM sleeps while the actor trains"
                if r.free_cache_engine
                else ("false: vLLM keeps its reservation while the actor trains")
            )
            row("rollout.free_cache_engine", sleeps)
        else:
            add(f"  (rollout.name={r.name}: generation uses the actor's own weights, no separate KV reservation)")
    return "\n".join(out)
