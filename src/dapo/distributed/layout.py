"""The layout of one training step on a given world: pure arithmetic over the validated config and a model's shape.

``dapo explain`` prints it. Nothing here touches torch, a file or the network: the caller resolves the model's
``config.json`` values into a :class:`ModelShape` (a local folder, or :data:`KNOWN_MODELS`) and passes the world size.

What is computed, and from what:

* prompts / responses per step, the generation batch and the generation rounds to expect under dynamic sampling:
  ``ceil(train_batch_size / (gen_batch_size * f))`` for an assumed informative-group fraction ``f``, bounded by
  ``algorithm.filter_groups.max_num_gen_batches``;
* optimizer steps per rollout step: ``ppo_epochs * train_batch_size / ppo_mini_batch_size``;
* the per-rank share: the actor is data parallel over the whole world (FSDP, no sequence parallelism), vLLM engines
  are ``world / rollout.tensor_model_parallel_size``;
* micro-batches per rank per mini-batch: token budget ``actor.ppo_max_token_len_per_gpu`` against the expected tokens
  of a sample (mean prompt + mean response, both assumptions) and against the worst case (every sample at
  ``max_prompt_length + max_response_length``);
* memory per GPU, as estimates: parameters, gradients and AdamW state (fp32 master weights, fp32 gradients, fp32 m and
  v: 16 bytes per parameter, as this actor keeps them), sharded over the world by FSDP and unsharded for comparison;
  activations of one micro-batch with and without gradient checkpointing (:func:`activation_bytes_per_token_layer`);
  the fp32 logits chunk of the log-prob computation; vLLM's weights and KV cache per GPU (divided by tensor parallel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from dapo.config.schema import DapoConfig

__all__ = [
    "KNOWN_MODELS",
    "Assumptions",
    "Layout",
    "LayoutError",
    "ModelShape",
    "activation_bytes_per_token_layer",
    "check_layout",
    "compute_layout",
    "known_model_shape",
]

GIB = 1024**3


class LayoutError(ValueError):
    """The config cannot be laid out on this world; ``problems`` name the keys, one message each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


# ------------------------------------------------------------------------------------------------ model shapes
@dataclass(frozen=True)
class ModelShape:
    """The config.json values the estimates need (Qwen2 / Llama decoder: attention + SwiGLU MLP + 2 RMSNorms)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v biases: true for Qwen2, false for Llama
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int | None = None
    source: str = ""

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, name: str, source: str) -> ModelShape:
        """From a Hugging Face ``config.json`` mapping; a missing required key raises ``KeyError`` naming it."""
        model_type = str(config.get("model_type", ""))
        bias = config.get("attention_bias")
        if bias is None:
            bias = model_type.startswith("qwen2")
        return cls(
            name=name,
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=int(config["num_attention_heads"]),
            num_key_value_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(bias),
            head_dim=int(config["head_dim"]) if config.get("head_dim") else None,
            max_position_embeddings=(
                int(config["max_position_embeddings"]) if config.get("max_position_embeddings") else None
            ),
            source=source,
        )

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): num_key_value_heads * head_dim."""
        return self.num_key_value_heads * self.resolved_head_dim

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.resolved_head_dim

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: q, k, v (with biases if any), o, gate/up/down, two RMSNorm weights."""
        h, i = self.hidden_size, self.intermediate_size
        qkv = h * (self.q_dim + 2 * self.kv_dim) + ((self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0)
        return qkv + self.q_dim * h + 3 * h * i + 2 * h

    @property
    def num_parameters(self) -> int:
        """Embedding + layers + final norm + LM head (none of its own when tied to the embedding)."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + self.num_hidden_layers * self.layer_parameters + self.hidden_size + head


def _shape(name: str, source: str, **values: Any) -> ModelShape:
    return ModelShape.from_hf_config(values, name=name, source=source)


# Published config.json values (Hugging Face model cards' files), for when the weights are not on this machine.
# Keys are matched as prefixes of the model folder's or Hub id's last component, case-insensitive, longest first.
KNOWN_MODELS: dict[str, ModelShape] = {
    "qwen2.5-32b": _shape(
        "Qwen2.5-32B",
        "built-in table: config.json of Qwen/Qwen2.5-32B",
        model_type="qwen2",
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    "qwen2.5-math-7b": _shape(
        "Qwen2.5-Math-7B",
        "built-in table: config.json of Qwen/Qwen2.5-Math-7B",
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
    "qwen2.5-7b": _shape(
        "Qwen2.5-7B",
        "built-in table: config.json of Qwen/Qwen2.5-7B",
        model_type="qwen2",
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    "smollm2-135m": _shape(
        "SmolLM2-135M",
        "built-in table: config.json of HuggingFaceTB/SmolLM2-135M",
        model_type="llama",
        attention_bias=False,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "tiny-qwen2": _shape(
        "tiny-qwen2 (embedded)",
        "built-in table: src/dapo/assets/tiny-qwen2/config.json",
        model_type="qwen2",
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=601,
        tie_word_embeddings=True,
        max_position_embeddings=512,
    ),
}


def known_model_shape(name: str) -> ModelShape | None:
    """The built-in shape whose key prefixes the last component of ``name`` (a path or Hub id), or None."""
    last = name.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1].lower()
    for key in sorted(KNOWN_MODELS, key=len, reverse=True):
        if last.startswith(key):
            return KNOWN_MODELS[key]
    return None


# ------------------------------------------------------------------------------------------------ the layout
@dataclass(frozen=True)
class Assumptions:
    """What the arithmetic cannot know from the config; every one is printed with the flag that changes it."""

    informative_fraction: float = 0.5  # share of prompt groups Eq. 11 keeps (neither all right nor all wrong)
    mean_prompt_tokens: int | None = None  # None: max_prompt_length / 2
    mean_response_tokens: int | None = None  # None: max_response_length / 2
    gpu_memory_gib: float = 80.0


def activation_bytes_per_token_layer(model: ModelShape, act_bytes: int) -> int:
    """Bytes autograd keeps per token per decoder layer (flash/sdpa attention: no [seq, seq] score matrix).

    Counted tensors: the input and output of both RMSNorms (4h), q, k, v before and q, k after RoPE (2q + 3kv), the
    attention output fed to o_proj (q), and in the MLP gate, up, silu(gate) and their product (4i):
    ``act_bytes * (4h + 3q + 3kv + 4i)``. An estimate within the usual tens of percent (Korthikanti et al. 2022
    count the same way), not a measurement.
    """
    h, i = model.hidden_size, model.intermediate_size
    return act_bytes * (4 * h + 3 * model.q_dim + 3 * model.kv_dim + 4 * i)


@dataclass(frozen=True)
class Memory:
    """Per-GPU estimates in bytes."""

    num_parameters: int
    param_bytes: int  # fp32 master parameters (all of them, unsharded)
    grad_bytes: int
    optim_bytes: int  # AdamW m and v, fp32
    world_size: int
    gathered_layer_bytes: int  # one FSDP unit (a decoder layer) all-gathered, x2 with prefetch
    act_tokens: int  # tokens of the micro-batch the activations are sized for (the token bound)
    act_no_ckpt_bytes: int
    act_ckpt_bytes: int
    gradient_checkpointing: bool
    logits_chunk_bytes: int
    vllm_weight_bytes: int  # per GPU, bf16 weights / tensor parallel
    kv_bytes_per_token: int  # per GPU (divided by tensor parallel)
    kv_sequences: int  # sequences sized for: rollout.max_num_seqs or the engine's whole share of a round
    kv_sequences_from: str
    kv_bytes: int  # kv_sequences at full length (max_prompt_length + max_response_length)
    vllm_reserved_bytes: int  # gpu_memory_utilization x GPU memory
    kv_room_bytes: int  # what that reservation leaves for the KV cache after the weights
    gpu_bytes: int

    @property
    def sharded_state_bytes(self) -> int:
        return (self.param_bytes + self.grad_bytes + self.optim_bytes) // self.world_size

    @property
    def unsharded_state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optim_bytes

    @property
    def activation_bytes(self) -> int:
        return self.act_ckpt_bytes if self.gradient_checkpointing else self.act_no_ckpt_bytes

    @property
    def actor_peak_bytes(self) -> int:
        """Training phase: sharded states + a gathered layer + activations (as configured) + one logits chunk."""
        return self.sharded_state_bytes + self.gathered_layer_bytes + self.activation_bytes + self.logits_chunk_bytes

    @property
    def kv_room_tokens(self) -> int:
        return max(0, self.kv_room_bytes) // self.kv_bytes_per_token if self.kv_bytes_per_token else 0


@dataclass(frozen=True)
class Layout:
    world_size: int
    nnodes: int
    nproc_per_node: int
    assumptions: Assumptions
    prompts_per_step: int
    n: int
    gen_batch_size: int
    dynamic_sampling: bool
    max_num_gen_batches: int  # <= 0: unlimited
    expected_rounds: int
    rounds_needed: int  # before the max_num_gen_batches bound
    min_fraction_one_round: float  # f above which one round fills the batch
    min_fraction_all_rounds: float | None  # f below which max_num_gen_batches is exhausted (None: unlimited)
    mean_prompt_tokens: int
    mean_response_tokens: int
    expected_generated_tokens: int
    optimizer_steps: int
    actor_ranks: int
    rollout_tp: int
    rollout_engines: int
    prompts_per_engine_round: int
    prompts_per_rank_step: float
    samples_per_rank_step: float
    samples_per_rank_mini_batch: int
    mini_batch_groups: int
    token_budget: int | None  # None: fixed-size micro-batches
    max_sample_tokens: int
    expected_micro_batches: int
    max_micro_batches: int
    token_bound: int
    memory: Memory | None
    model: ModelShape | None
    warnings: list[str] = field(default_factory=list)


def _mean_tokens(cfg: DapoConfig, a: Assumptions) -> tuple[int, int]:
    p = a.mean_prompt_tokens if a.mean_prompt_tokens is not None else cfg.data.max_prompt_length // 2
    r = a.mean_response_tokens if a.mean_response_tokens is not None else cfg.data.max_response_length // 2
    return p, r


def check_layout(
    cfg: DapoConfig, world_size: int, nproc_per_node: int | None = None, assumptions: Assumptions = Assumptions()
) -> tuple[list[str], list[str]]:
    """(errors, warnings) of laying ``cfg`` out on ``world_size`` ranks, each naming the keys involved."""
    errors: list[str] = []
    warnings: list[str] = []
    d, a, r, fg = cfg.data, cfg.actor, cfg.rollout, cfg.algorithm.filter_groups
    if world_size < 1:
        return [f"the world size must be >= 1, got {world_size}"], []
    if not 0.0 < assumptions.informative_fraction <= 1.0:
        errors.append(f"--informative-fraction must be in (0, 1], got {assumptions.informative_fraction}")
    tp = r.tensor_model_parallel_size
    if world_size % tp != 0:
        errors.append(
            f"rollout.tensor_model_parallel_size ({tp}) must divide the world size ({world_size} = "
            "--nnodes x --nproc-per-node)"
        )
        engines = None
    else:
        engines = world_size // tp
        if nproc_per_node is not None and nproc_per_node % tp != 0:
            warnings.append(
                f"rollout.tensor_model_parallel_size ({tp}) does not divide --nproc-per-node "
                f"({nproc_per_node}): tensor-parallel groups span nodes (slow all-reduces)"
            )
    if engines is not None:
        if d.train_batch_size % engines != 0:
            errors.append(
                f"data.train_batch_size ({d.train_batch_size}) must be divisible by the data-parallel size "
                f"({engines} = world {world_size} / rollout.tensor_model_parallel_size {tp})"
            )
        if d.effective_gen_batch_size % engines != 0:
            errors.append(
                f"data.gen_batch_size ({d.effective_gen_batch_size}) must be divisible by the "
                f"data-parallel size ({engines} = world {world_size} / rollout.tensor_model_parallel_size "
                f"{tp}): every engine generates an equal share of a round"
            )
    if a.ppo_mini_batch_size > d.train_batch_size:
        errors.append(
            f"actor.ppo_mini_batch_size ({a.ppo_mini_batch_size}) is larger than data.train_batch_size "
            f"({d.train_batch_size})"
        )
    elif d.train_batch_size % a.ppo_mini_batch_size != 0:
        errors.append(
            f"actor.ppo_mini_batch_size ({a.ppo_mini_batch_size}) must divide data.train_batch_size "
            f"({d.train_batch_size})"
        )
    mini_samples = a.ppo_mini_batch_size * r.n
    if mini_samples % world_size != 0:
        errors.append(
            f"a mini-batch's samples (actor.ppo_mini_batch_size {a.ppo_mini_batch_size} x rollout.n "
            f"{r.n} = {mini_samples}) must be divisible by the number of ranks ({world_size})"
        )
    elif not a.use_dynamic_bsz and a.ppo_micro_batch_size_per_gpu is not None:
        per_rank = mini_samples // world_size
        if per_rank % a.ppo_micro_batch_size_per_gpu != 0:
            errors.append(
                f"actor.ppo_micro_batch_size_per_gpu ({a.ppo_micro_batch_size_per_gpu}) must divide the "
                f"samples per rank of a mini-batch ({per_rank} = actor.ppo_mini_batch_size x rollout.n / "
                f"{world_size} ranks)"
            )
    if mini_samples % world_size == 0 and a.ppo_mini_batch_size < world_size:
        warnings.append(
            f"a mini-batch holds {a.ppo_mini_batch_size} prompt groups (actor.ppo_mini_batch_size) for "
            f"{world_size} ranks: dapo.distributed.data_parallel shares whole groups today, so only "
            f"{a.ppo_mini_batch_size} of the {world_size} ranks would train on each mini-batch; the "
            f"per-rank numbers below assume its samples split evenly, {mini_samples // world_size} per "
            "rank, as verl does"
        )
    ob = cfg.reward_model.overlong_buffer
    if ob.enable and ob.len >= d.max_response_length:
        errors.append(
            f"reward_model.overlong_buffer.len (L_cache = {ob.len}) must be below data.max_response_length "
            f"(L_max = {d.max_response_length}): Eq. 13 punishes lengths in (L_max - L_cache, L_max]"
        )
    full = d.max_prompt_length + d.max_response_length
    if a.use_dynamic_bsz and a.ppo_max_token_len_per_gpu < full:
        warnings.append(
            f"actor.ppo_max_token_len_per_gpu ({a.ppo_max_token_len_per_gpu}) is smaller than "
            f"data.max_prompt_length + data.max_response_length ({full}): a full-length sample exceeds "
            "the token budget and runs as a micro-batch of its own"
        )
    if r.max_model_len is not None and r.max_model_len < full:
        errors.append(
            f"rollout.max_model_len ({r.max_model_len}) is below data.max_prompt_length + "
            f"data.max_response_length ({full}): vLLM would cut responses short"
        )
    gen = d.effective_gen_batch_size
    max_rounds = fg.max_num_gen_batches if fg.enable else 1
    if max_rounds > 0 and gen * max_rounds < d.train_batch_size:
        problem = (
            f"data.gen_batch_size ({gen}) x {max_rounds} round(s) "
            f"({'algorithm.filter_groups.max_num_gen_batches' if fg.enable else 'filter_groups off: one round'}) "
            f"< data.train_batch_size ({d.train_batch_size}): a step can never fill its batch"
        )
        if fg.on_exhausted == "train_on_partial":
            warnings.append(problem + " (algorithm.filter_groups.on_exhausted=train_on_partial trains on less)")
        else:
            errors.append(problem)
    return errors, warnings


def compute_layout(
    cfg: DapoConfig,
    model: ModelShape | None,
    *,
    nnodes: int = 1,
    nproc_per_node: int = 1,
    assumptions: Assumptions = Assumptions(),
    engine_reserves_gpu_memory: bool = False,
) -> Layout:
    """The layout of one step of ``cfg`` on ``nnodes x nproc_per_node`` ranks; raises :class:`LayoutError`.

    ``engine_reserves_gpu_memory``: the rollout engine holds its own weights and reserves
    ``rollout.gpu_memory_utilization`` of each GPU (vLLM), so its KV room and its reservation beside the actor's
    training phase are checked too. The caller reads it off the engine registry's capabilities
    (``dapo.rollout.factory.engine_capabilities``): this layer sits below the rollout layer and never reads engine
    names."""
    world = nnodes * nproc_per_node
    errors, warnings = check_layout(cfg, world, nproc_per_node, assumptions)
    if nnodes < 1 or nproc_per_node < 1:
        errors.insert(0, f"--nnodes ({nnodes}) and --nproc-per-node ({nproc_per_node}) must be >= 1")
    if errors:
        raise LayoutError(errors)
    d, a, r, fg = cfg.data, cfg.actor, cfg.rollout, cfg.algorithm.filter_groups
    n, train, gen = r.n, d.train_batch_size, d.effective_gen_batch_size
    f = assumptions.informative_fraction

    # generation rounds
    dynamic = fg.enable
    max_rounds = fg.max_num_gen_batches if dynamic else 1
    if dynamic:
        rounds_needed = max(1, math.ceil(train / (gen * f) - 1e-9))
        expected_rounds = min(rounds_needed, max_rounds) if max_rounds > 0 else rounds_needed
        if max_rounds > 0 and rounds_needed > max_rounds:
            warnings.append(
                f"at the assumed informative fraction {f:g}, a step needs {rounds_needed} generation rounds, more "
                f"than algorithm.filter_groups.max_num_gen_batches ({max_rounds}): it would stop "
                f"(on_exhausted={fg.on_exhausted})"
            )
    else:
        rounds_needed = expected_rounds = 1
    min_one = min(1.0, train / gen)
    min_all = train / (gen * max_rounds) if dynamic and max_rounds > 0 else None
    p_mean, r_mean = _mean_tokens(cfg, assumptions)
    generated = expected_rounds * gen * n * r_mean

    # ranks and micro-batches
    tp = r.tensor_model_parallel_size
    engines = world // tp
    mini_samples_rank = a.ppo_mini_batch_size * n // world
    full = d.max_prompt_length + d.max_response_length
    if a.use_dynamic_bsz:
        budget = a.ppo_max_token_len_per_gpu
        expected_mb = max(1, math.ceil(mini_samples_rank * (p_mean + r_mean) / budget))
        per_mb_full = max(1, budget // full)
        max_mb = math.ceil(mini_samples_rank / per_mb_full)
        bound = max(budget, full)
    else:
        budget = None
        mbs = a.ppo_micro_batch_size_per_gpu or 1
        expected_mb = max_mb = math.ceil(mini_samples_rank / mbs)
        bound = mbs * full

    memory = None
    if model is not None:
        memory = _memory(cfg, model, world, engines, bound, assumptions)
        if memory.actor_peak_bytes > memory.gpu_bytes:
            warnings.append(
                f"the actor's training phase needs ~{memory.actor_peak_bytes / GIB:.1f} GiB per GPU, more "
                f"than the assumed {assumptions.gpu_memory_gib:g} GiB (--gpu-memory-gib)"
            )
        if engine_reserves_gpu_memory:
            if memory.kv_room_bytes <= 0:
                warnings.append(
                    f"rollout.gpu_memory_utilization ({r.gpu_memory_utilization}) of "
                    f"{assumptions.gpu_memory_gib:g} GiB leaves no room for vLLM's KV cache after its "
                    f"weights ({memory.vllm_weight_bytes / GIB:.1f} GiB per GPU)"
                )
            elif memory.kv_room_tokens < full:
                warnings.append(
                    f"vLLM's KV room ({memory.kv_room_tokens} tokens per GPU) is less than one "
                    f"full-length sequence ({full} tokens)"
                )
            if not r.free_cache_engine and (memory.actor_peak_bytes + memory.vllm_reserved_bytes > memory.gpu_bytes):
                warnings.append(
                    f"colocated, vLLM's reservation ({memory.vllm_reserved_bytes / GIB:.1f} GiB) plus the "
                    f"actor's training phase ({memory.actor_peak_bytes / GIB:.1f} GiB) exceed "
                    f"{assumptions.gpu_memory_gib:g} GiB: set rollout.free_cache_engine=true to release "
                    "vLLM's memory while the actor trains"
                )

    return Layout(
        world_size=world,
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        assumptions=assumptions,
        prompts_per_step=train,
        n=n,
        gen_batch_size=gen,
        dynamic_sampling=dynamic,
        max_num_gen_batches=max_rounds,
        expected_rounds=expected_rounds,
        rounds_needed=rounds_needed,
        min_fraction_one_round=min_one,
        min_fraction_all_rounds=min_all,
        mean_prompt_tokens=p_mean,
        mean_response_tokens=r_mean,
        expected_generated_tokens=generated,
        optimizer_steps=a.ppo_epochs * train // a.ppo_mini_batch_size,
        actor_ranks=world,
        rollout_tp=tp,
        rollout_engines=engines,
        prompts_per_engine_round=gen // engines,
        prompts_per_rank_step=train / world,
        samples_per_rank_step=train * n / world,
        samples_per_rank_mini_batch=mini_samples_rank,
        mini_batch_groups=a.ppo_mini_batch_size,
        token_budget=budget,
        max_sample_tokens=full,
        expected_micro_batches=expected_mb,
        max_micro_batches=max_mb,
        token_bound=bound,
        memory=memory,
        model=model,
        warnings=warnings,
    )


def _memory(
    cfg: DapoConfig, model: ModelShape, world: int, engines: int, act_tokens: int, assumptions: Assumptions
) -> Memory:
    a, r, d = cfg.actor, cfg.rollout, cfg.data
    n_params = model.num_parameters
    act_bytes = 2 if a.dtype == "bf16" else 4
    per_layer_act = activation_bytes_per_token_layer(model, act_bytes)
    layers = model.num_hidden_layers
    no_ckpt = layers * act_tokens * per_layer_act
    # checkpointed: each layer's input is kept, and one layer's activations live again during its recomputation
    ckpt = layers * act_tokens * model.hidden_size * act_bytes + act_tokens * per_layer_act
    # the chunked LM head: its output in the compute dtype, the fp32 logits and two fp32 temporaries
    # (logsumexp's exponentials and the entropy's softmax)
    logits_chunk = a.logprob_chunk_size * model.vocab_size * (act_bytes + 3 * 4)
    tp = r.tensor_model_parallel_size
    vllm_bytes = 2 if r.dtype in ("auto", "bfloat16", "float16") else 4  # auto is bfloat16 on a GPU
    kv_per_token = 2 * layers * model.num_key_value_heads * model.resolved_head_dim * vllm_bytes // tp
    full = d.max_prompt_length + d.max_response_length
    if r.max_num_seqs is not None:
        seqs, seqs_from = r.max_num_seqs, "rollout.max_num_seqs"
    else:
        seqs = d.effective_gen_batch_size // engines * r.n
        seqs_from = "the engine's whole share of a round (rollout.max_num_seqs not set)"
    gpu = int(assumptions.gpu_memory_gib * GIB)
    reserved = int(r.gpu_memory_utilization * gpu)
    vllm_weights = n_params * vllm_bytes // tp
    return Memory(
        num_parameters=n_params,
        param_bytes=4 * n_params,
        grad_bytes=4 * n_params,
        optim_bytes=8 * n_params,
        world_size=world,
        gathered_layer_bytes=(2 if world > 1 else 0) * 4 * model.layer_parameters,
        act_tokens=act_tokens,
        act_no_ckpt_bytes=no_ckpt,
        act_ckpt_bytes=ckpt,
        gradient_checkpointing=a.gradient_checkpointing,
        logits_chunk_bytes=logits_chunk,
        vllm_weight_bytes=vllm_weights,
        kv_bytes_per_token=kv_per_token,
        kv_sequences=seqs,
        kv_sequences_from=seqs_from,
        kv_bytes=seqs * full * kv_per_token,
        vllm_reserved_bytes=reserved,
        kv_room_bytes=reserved - vllm_weights,
        gpu_bytes=gpu,
    )
