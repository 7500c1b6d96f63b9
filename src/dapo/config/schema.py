"""The typed configuration tree of a DAPO run.

One `DapoConfig` is built at the edge (``dapo.config.loading``: YAML file + dotted command-line overrides), validated
once, and passed down; nothing below the CLI reads files or environment variables for configuration.

Section and key names follow verl's so that published recipes translate one to one (see docs/config.md for the full
mapping).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from dapo.config.policy_losses import knob_parameter, knob_parameters, registered_policy_loss, registered_policy_losses

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "BigArithDataConfig",
    "CalculatorToolConfig",
    "ConfigError",
    "CustomRewardFunctionConfig",
    "DapoConfig",
    "DataConfig",
    "DistillationConfig",
    "DistillationLossConfig",
    "TeacherModelConfig",
    "FilterGroupsConfig",
    "FsdpConfig",
    "ModelConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PolicyLossConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "SandboxConfig",
    "SkipSolvedPromptsConfig",
    "SynthDataConfig",
    "TrainerConfig",
    "RolloutCorrectionConfig",
    "ValSamplingConfig",
]


class ConfigError(ValueError):
    """A configuration problem, with a message naming the key and what is allowed."""


class _Section(BaseModel):
    # Unknown keys are errors (a typo must never silently fall back to a default); no float key takes inf or NaN.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


# --------------------------------------------------------------------------------------------- data
class BigArithDataConfig(_Section):
    """The tool task's knobs (``data.synth.task=big_arith``; dapo.data.big_arith)."""

    kind: Literal["product", "sum"] = Field("product", description="a product of the operands, or their sum")
    min_digits: int = Field(4, ge=1, le=30, description="digits per operand, at least")
    max_digits: int = Field(6, ge=1, le=30, description="digits per operand, at most")
    operands: int = Field(2, ge=2, le=20, description="numbers per problem")


class SynthDataConfig(_Section):
    """The built-in synthetic arithmetic task, used when ``data.train_files`` is empty."""

    num_train: int = Field(4000, gt=0, description="number of training problems generated")
    num_val: int = Field(128, gt=0, description="number of validation problems generated")
    train_seed: int = Field(1234, description="seed of the training problems")
    val_seed: int = Field(4321, description="seed of the validation problems (disjoint stream)")
    min_operands: int | None = Field(None, description="difficulty knob; None = the tiny model's training value")
    max_operands: int | None = Field(None, description="difficulty knob; None = the tiny model's training value")
    max_value: int | None = Field(None, description="difficulty knob; None = the tiny model's training value")
    word_problems: bool | None = Field(
        None, description="stories (true) or bare expressions (false); None = as trained"
    )
    operations: list[Literal["+", "-", "*"]] | None = Field(
        None, min_length=1, description="operations that may appear (of +, -, *); None = as trained"
    )
    task: Literal["arith", "big_arith"] = Field(
        "arith",
        description="arith: the tiny model's word problems; big_arith: multi-digit products / sums of large "
        "numbers that need the code interpreter (rollout.multi_turn), see docs/tools.md",
    )
    big_arith: BigArithDataConfig = Field(default_factory=BigArithDataConfig)


class DataConfig(_Section):
    train_files: list[str] = Field(
        default_factory=list, description="parquet/JSONL files in the DAPO schema; empty = synthetic task"
    )
    val_files: list[str] = Field(default_factory=list, description="validation files; empty = synthetic validation set")
    synth: SynthDataConfig = Field(default_factory=SynthDataConfig)
    max_prompt_length: int = Field(256, gt=0, description="prompt tokens (after the chat template)")
    max_response_length: int = Field(64, gt=0, description="L_max: generation stops here (finish reason 'length')")
    train_batch_size: int = Field(32, gt=0, description="prompt groups per training step (after dynamic sampling)")
    gen_batch_size: int | None = Field(
        None, gt=0, description="prompts per generation round; default = train_batch_size"
    )
    val_max_samples: int | None = Field(None, gt=0, description="cap on validation prompts (None = all)")
    shuffle: bool = Field(True, description="reshuffle training prompts every epoch")
    seed: int = Field(1, description="seed of the data-loader order")
    filter_overlong_prompts: Literal["drop", "error"] = Field(
        "drop", description="prompts longer than max_prompt_length: drop them with a count, or stop with an error"
    )

    @property
    def effective_gen_batch_size(self) -> int:
        return self.gen_batch_size or self.train_batch_size


# -------------------------------------------------------------------------------------------- model
class ModelConfig(_Section):
    path: str | None = Field(None, description="Hugging Face model folder; None = the embedded tiny Qwen2")
    gguf_file: str | None = Field(None, description="GGUF file name inside `path` (dequantized on load)")
    tokenizer_path: str | None = Field(None, description="tokenizer folder if not the model's")
    trust_remote_code: bool = Field(False, description="allow custom modelling code from the model folder")
    save_pretrained_cache: bool = Field(
        True, description="after a GGUF load, save an HF copy next to the run so later loads take a second"
    )
    # LoRA (Hugging Face PEFT, dapo.model.lora); verl's names. lora_rank=0 (verl's default) trains every weight.
    # The cap is a cheap sanity bound before any model loads (no released model has a layer 65536 wide); the real bound,
    # min(in, out) of the targeted layers, is checked against the model in dapo.model.lora.apply_lora.
    lora_rank: int = Field(
        0, ge=0, le=65536, description="LoRA rank r of the actor's adapters (PEFT); 0 = full fine-tuning"
    )
    lora_alpha: float = Field(16.0, gt=0.0, description="LoRA alpha: the adapters' update is scaled by alpha / rank")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input during training")
    target_modules: Literal["all-linear"] | list[str] = Field(
        "all-linear",
        description="modules that get adapters: 'all-linear' (every linear layer but the output "
        "head, PEFT's meaning) or a list of module names (e.g. [q_proj, v_proj]), checked against the model's",
    )

    @property
    def lora(self) -> bool:
        """Whether the actor trains LoRA adapters (lora_rank >= 1) instead of every weight."""
        return self.lora_rank >= 1

    @model_validator(mode="after")
    def _lora_keys_need_a_rank(self) -> "ModelConfig":
        # As the fsdp keys: a LoRA setting without a rank would silently train every weight instead.
        defaults = {"lora_alpha": 16.0, "lora_dropout": 0.0, "target_modules": "all-linear"}
        changed = sorted(k for k, v in defaults.items() if getattr(self, k) != v)
        if not self.lora and changed:
            raise ValueError(
                f"model.{', model.'.join(changed)} only apply with LoRA: set model.lora_rank >= 1 "
                "(actor_rollout_ref.model.lora_rank; 0 = full fine-tuning)"
            )
        if isinstance(self.target_modules, list) and (
            not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules)
        ):
            raise ValueError(
                f"model.target_modules must be 'all-linear' or a non-empty list of module names, got "
                f"{self.target_modules!r}"
            )
        return self


# ------------------------------------------------------------------------------------------ rollout
class SandboxConfig(_Section):
    """The code interpreter's isolation and limits per call (dapo.tools.sandbox; docs/tools.md)."""

    mode: Literal["auto", "bwrap", "unsafe-no-isolation"] = Field(
        "auto",
        description="auto/bwrap: bubblewrap namespaces + seccomp (auto refuses where it cannot run); "
        "unsafe-no-isolation: no boundary at all (an audit hook against accidents), only when named",
    )
    wall_time_s: float = Field(5.0, gt=0.0, le=3600.0, description="wall-clock limit; the call's processes are killed")
    cpu_time_s: float = Field(5.0, gt=0.0, le=3600.0, description="CPU-time limit (RLIMIT_CPU)")
    memory_mb: int = Field(
        512,
        ge=64,
        description="address-space limit per process (RLIMIT_AS) and memory of "
        "the call's processes together (cgroup memory.max, where there is one) in MiB",
    )
    max_output_bytes: int = Field(65536, ge=1, description="stdout + stderr kept; more is cut and the call killed")
    max_processes: int = Field(
        16,
        ge=1,
        description="processes/threads (RLIMIT_NPROC where it binds; the call's cgroup pids.max where there is one)",
    )
    max_files: int = Field(4096, ge=16, description="inodes of the working directory's tmpfs (bwrap as root)")
    cpu_cores: float = Field(1.0, ge=0.01, le=1024.0, description="CPU quota of the call's cgroup (cpu.max)")

    @field_validator("mode", mode="before")
    @classmethod
    def _renamed_mode(cls, value: object) -> object:
        if value == "process":
            raise ValueError(
                "'process' is refused: it is not an isolation boundary (the code runs with the "
                "trainer's uid; one line of the standard library gets past its audit hook, "
                "docs/tools.md); use bwrap, or name it unsafe-no-isolation"
            )
        return value


def _require_output_placeholder(template: str, section: str) -> None:
    """A tool's response template shows the tool's output where ``{output}`` stands: without it the model would
    never read what its call returned."""
    if "{output}" not in template:
        raise ValueError(f"{section}.tool_response_template must contain {{output}}")


class CalculatorToolConfig(_Section):
    """The calculator tool's call format (dapo.tools.calculator: arithmetic evaluated from its syntax tree, no
    sandbox needed)."""

    tool_call_start: str = Field(
        "<calculator>", description="text that opens a calculator call ('' = the turn's start)"
    )
    tool_call_end: str = Field("</calculator>", min_length=1, description="text that closes a calculator call")
    tool_response_template: str = Field(
        "<result>{output}</result>",
        description="how the calculator's answer is shown ({output}: the value, or 'error: <reason>')",
    )

    @model_validator(mode="after")
    def _template_has_output(self) -> "CalculatorToolConfig":
        _require_output_placeholder(self.tool_response_template, "rollout.multi_turn.calculator")
        return self


# The names dapo.tools.registry.TOOLS registers (config sits below the registry's layer; tests/tools/
# test_tool_registry.py keeps the two lists one), so an unknown name is refused here, naming the key.
ToolName = Literal["python", "calculator"]


class MultiTurnConfig(_Section):
    """Multi-turn rollouts with tools: a sandboxed Python interpreter, a calculator (verl:
    actor_rollout_ref.rollout.multi_turn.*)."""

    enable: bool = Field(False, description="generate, run each closed tool call, append its output, continue")
    tools: list[ToolName] = Field(
        default_factory=lambda: ["python"],
        min_length=1,
        description="the tools the model may call (dapo.tools.registry): python (tool_call_* and sandbox.* below), "
        "calculator (calculator.*); a turn's call goes to the tool whose call closes first",
    )
    max_assistant_turns: int = Field(3, ge=1, description="model turns per sample (a call in the last is not run)")
    max_tool_response_length: int = Field(64, ge=1, description="tokens of one tool output (cut with '...')")
    tool_response_truncate_side: Literal["left", "right", "middle"] = Field("middle")
    max_parallel_calls: int = Field(4, ge=1, description="tool processes at once")
    tool_call_start: str = Field("```python", description="python: text that opens a call ('' = the turn's start)")
    tool_call_end: str = Field("```", min_length=1, description="python: text that closes a call")
    tool_response_template: str = Field(
        "\n```output\n{output}\n```\n",
        description="python: how a tool's output is shown ({output}: what the code printed)",
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    calculator: CalculatorToolConfig = Field(default_factory=CalculatorToolConfig)

    @model_validator(mode="after")
    def _template_has_output(self) -> "MultiTurnConfig":
        _require_output_placeholder(self.tool_response_template, "rollout.multi_turn")
        return self

    @model_validator(mode="after")
    def _tools_distinct(self) -> "MultiTurnConfig":
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"rollout.multi_turn.tools names a tool twice: {self.tools}")
        return self


class ValSamplingConfig(_Section):
    """Validation sampling; defaults are the paper's evaluation setting (temperature 1.0, top-p 0.7)."""

    n: int = Field(8, gt=0, description="samples per validation prompt (the paper: 32 for avg@32)")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(0.7, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)


class RolloutConfig(_Section):
    # Checked against the engine registry (dapo.rollout.factory.ENGINES, a layer above this one) when the run is
    # built, before anything is loaded: the registry is the one list of engine names.
    name: str = Field(
        "hf",
        min_length=1,
        description="rollout engine, one registered in dapo.rollout.factory: 'hf' (hand-written KV-cached "
        "Transformers engine) or 'vllm'",
    )
    n: int = Field(8, gt=0, description="G: responses sampled per prompt")
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1 = off")
    max_batch_size: int | None = Field(None, gt=0, description="hf: sequences per engine call (None = all at once)")
    val_kwargs: ValSamplingConfig = Field(default_factory=ValSamplingConfig)
    weight_sync_probe: bool = Field(
        True, description="after every weight push compare the engine's and the actor's log-probs of a probe sequence"
    )
    probe_logprob_threshold: float | None = Field(
        0.05,
        gt=0.0,
        description="stop the run when the probe's mean |engine - actor| log-prob gap exceeds this (stale weights); "
        "None = only log rollout/probe_logprob_diff",
    )
    # vLLM engine (rollout.name=vllm); verl's names
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="the engine's weights/activations dtype. hf: auto = the actor's (the engine shares its "
        "module); another dtype generates from a copy in it, refreshed after every update (bfloat16 decodes 1.8x "
        "faster where the CPU has AMX/avx512_bf16, but pi_old is then recomputed when a rollout step has several "
        "optimizer steps). vllm: auto = float32 on CPU, bfloat16 on GPU",
    )
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="vllm: share of device memory for weights + KV cache (on CPU: of host memory, see cpu_kvcache_space_gb)",
    )
    tensor_model_parallel_size: int = Field(1, gt=0, description="vllm: tensor-parallel ranks per engine")
    n_gpus_per_node: int = Field(
        0,
        ge=0,
        description="under torchrun with async_training: the last N ranks own the rollout engine and only "
        "generate (disaggregated; verl's fully-async key), the others train; 0 = no rollout ranks. Built: 1 rollout "
        "rank beside 1 trainer rank",
    )
    enforce_eager: bool = Field(True, description="vllm: no CUDA graphs (faster start, slower decode on GPU)")
    free_cache_engine: bool = Field(
        False, description="vllm: sleep (free weights and KV cache) while the actor trains; GPU only"
    )
    max_num_batched_tokens: int | None = Field(
        None, gt=0, description="vllm: tokens per scheduler step (None = vLLM's)"
    )
    max_num_seqs: int | None = Field(None, gt=0, description="vllm: sequences decoded at once (None = vLLM's)")
    max_model_len: int | None = Field(
        None, gt=0, description="vllm: context length; None = max_prompt_length + max_response_length + 1"
    )
    cpu_kvcache_space_gb: float | None = Field(
        1.0, gt=0.0, description="vllm on CPU: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE); None = vLLM's default"
    )
    enable_prefix_caching: bool = Field(True, description="vllm: share the KV cache of a prompt's n samples")
    multi_turn: MultiTurnConfig = Field(default_factory=MultiTurnConfig)
    calculate_log_probs: bool = Field(
        True,
        description="engines return the sampled tokens' log-probs (needed for rollout/log_prob_diff and "
        "algorithm.rollout_correction); always on here, accepted for verl recipes",
    )
    true_on_policy: bool = Field(
        False,
        description="hf: the engine and the actor compute batch-invariantly, so the engine's sampling log-probs "
        "equal the actor's bitwise (rollout/log_prob_diff/max == 0.0; docs/true-on-policy.md)",
    )


# -------------------------------------------------------------------------------------------- actor
class RouterReplayConfig(_Section):
    """verl's ``actor_rollout_ref.actor.router_replay``: MoE routing replay (``dapo.model.router_replay``,
    docs/models.md)."""

    mode: Literal["disabled", "R2", "R3"] = Field(
        "disabled",
        description="R3: the rollout engine records each token's top-k experts per MoE layer and the "
        "actor's old-log-prob and update passes route to them; R2: the update replays the old-log-prob pass's "
        "routes. Gate weights stay the live router's, so the router keeps learning",
    )


class OptimConfig(_Section):
    lr: float = Field(
        1e-4, gt=0.0, description="1e-4 suits the embedded 1M-parameter model; the paper uses 1e-6 at 32B"
    )
    lr_warmup_steps: int = Field(3, ge=0, description="linear warm-up in optimizer steps, then constant")
    weight_decay: float = Field(0.1, ge=0.0)
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1)")
    eps: float = Field(1e-8, gt=0.0)

    @model_validator(mode="after")
    def _betas_in_range(self) -> "OptimConfig":
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"actor.optim.betas must each be in [0, 1), got {list(self.betas)}")
        return self


class FsdpConfig(_Section):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``) of the actor, used when ``actor.strategy`` is fsdp2."""

    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="dtype the sharded parameters are all-gathered in for forward and backward (the "
        "sharded master weights and the AdamW state stay float32)",
    )
    reduce_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the gradient reduce-scatter (summed over ranks)"
    )
    cpu_offload: bool = Field(
        False,
        description="keep the sharded parameters, gradients and AdamW state in CPU "
        "memory (CPUOffloadPolicy); the optimizer step then runs on the CPU",
    )


class PolicyLossConfig(_Section):
    """verl's ``actor.policy_loss``: which objective the actor minimises (docs/objectives.md) and the knobs only some
    objectives read (Clip-Cov / KL-Cov, arXiv 2505.22617)."""

    loss_mode: str = Field(
        "vanilla",
        description="vanilla = DAPO Eq. 10 (Clip-Higher, dual clip); gspo / gspo_token (sequence ratio), "
        "cispo (clipped detached IS weight), geo_mean (GMPO), sapo (soft gate), clip_cov / kl_cov; see "
        "docs/objectives.md for each one's formula and recommended clip values",
    )
    clip_cov_ratio: float = Field(
        0.0002,
        gt=0.0,
        le=1.0,
        description="clip_cov: share of tokens whose gradient is "
        "detached, drawn among those with covariance in (clip_cov_lb, clip_cov_ub)",
    )
    clip_cov_lb: float = Field(1.0, description="clip_cov: lower bound of the covariance band")
    clip_cov_ub: float = Field(5.0, description="clip_cov: upper bound of the covariance band")
    kl_cov_ratio: float = Field(
        0.0002, gt=0.0, le=1.0, description="kl_cov: share of tokens (largest covariance) given the KL penalty"
    )
    ppo_kl_coef: float = Field(1.0, ge=0.0, description="kl_cov: coefficient of the |log(pi/pi_old)| penalty")

    @field_validator("loss_mode")
    @classmethod
    def _registered(cls, name: str) -> str:
        registered_policy_loss(name)  # the registry is the list of names (dapo.core.policy_loss)
        return name

    @model_validator(mode="after")
    def _band_ordered(self) -> "PolicyLossConfig":
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(
                f"actor.policy_loss.clip_cov_lb ({self.clip_cov_lb}) must be < clip_cov_ub ({self.clip_cov_ub})"
            )
        return self


def _mode_defaulted_keys() -> list[str]:
    """The ``actor`` keys some registered loss has a paper default for (``PolicyLoss.paper_defaults``)."""
    return sorted({k for loss in registered_policy_losses().values() for k in loss.paper_defaults})


def _actor_field(dotted: str) -> FieldInfo | None:
    """The schema field of an ``actor`` key (``clip_ratio_low``, ``policy_loss.clip_cov_ratio``), or None."""
    section: type[BaseModel] = ActorConfig
    *parents, leaf = dotted.split(".")
    for part in parents:
        info = section.model_fields.get(part)
        if info is None or not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)):
            return None
        section = info.annotation
    return section.model_fields.get(leaf)


class ActorConfig(_Section):
    strategy: Literal["replicated", "fsdp2"] = Field(
        "replicated",
        description="data parallel under torchrun: every rank a full replica (gradients all-reduced), "
        "or the parameters, gradients and AdamW state sharded with FSDP2 (needs >= 2 ranks; the Transformers "
        "rollout engine then generates from an unsharded copy refreshed after every update)",
    )
    fsdp: FsdpConfig = Field(default_factory=FsdpConfig)
    ppo_mini_batch_size: int = Field(8, gt=0, description="prompt groups per optimizer step")
    ppo_epochs: int = Field(1, gt=0, description="mu: passes over the batch")
    shuffle: bool = Field(False, description="shuffle groups between ppo epochs")
    use_dynamic_bsz: bool = Field(True, description="micro-batches bounded by a token budget (padding-free)")
    ppo_max_token_len_per_gpu: int = Field(
        1024,
        gt=0,
        description="token budget of one packed micro-batch; without FlashAttention's varlen kernels (CPU, sdpa) a "
        "packed row's attention is quadratic in its length, so keep it near 1024 there (GPU recipes use ~22k)",
    )
    ppo_micro_batch_size_per_gpu: int | None = Field(None, gt=0, description="samples per micro-batch if not dynamic")
    layout: Literal["auto", "packed", "padded", "shared_prompt"] = Field(
        "auto",
        description="micro-batch layout of the actor's forward: packed (one row, padding-free; fast only with "
        "flash-attention's varlen kernels), padded (a row per sample, length-sorted micro-batches) or shared_prompt "
        "(each group's prompt run once, its responses on a copy of the prompt's KV cache); auto = packed under "
        "flash-attention, else shared_prompt (padded for FSDP2 or sliding-window models). Same gradient in all",
    )
    shared_prompt_chunk_tokens: int | None = Field(
        None,
        gt=0,
        description="shared_prompt layout: most tokens (rows x width) in one response pass, None = no cap; under "
        "activation checkpointing backward holds one pass's activations at a time, so this bounds the update's memory",
    )
    recompute_old_log_prob: Literal["auto", "always", "never"] = Field(
        "auto",
        description="the forward over the whole batch for pi_old: auto skips it when it cannot differ from what is "
        "known (one optimizer step per rollout step: pi_old is the current actor; or the Transformers engine "
        "sampled from the actor's own fp32 weights without top-p/top-k: pi_old is the engine's log-probs); never "
        "always uses the engine's log-probs",
    )
    clip_ratio_low: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="epsilon_low of Clip-Higher (Eq. 10), in [0, 1); "
        "when not set, gspo / gspo_token take 3e-4, geo_mean 0.4, cispo 0.999 (their "
        "papers')",
    )
    clip_ratio_high: float = Field(
        0.28,
        ge=0.0,
        le=1e6,
        description="epsilon_high of Clip-Higher (Eq. 10); <= 1e6 "
        "(1 + epsilon_high must stay a float32 number); when not set, gspo / gspo_token "
        "take 4e-4, geo_mean 0.4 (their papers')",
    )
    clip_ratio_c: float | None = Field(
        10.0, gt=1.0, le=1e6, description="dual-clip bound for negative advantages, <= 1e6; None = off"
    )
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = (
        Field(
            "token-mean",
            description="token-mean is DAPO's token-level loss (Eq. 12); when not set, loss modes gspo, "
            "gspo_token, geo_mean and sapo take their papers' seq-mean-token-mean (docs/objectives.md)",
        )
    )
    policy_loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    tau_pos: float = Field(1.0, gt=0.0, description="sapo: gate temperature of positive-advantage tokens")
    tau_neg: float = Field(1.05, gt=0.0, description="sapo: gate temperature of negative-advantage tokens")
    entropy_coeff: float = Field(0.0, description="entropy bonus (off in DAPO)")
    use_kl_loss: bool = Field(False, description="KL to the reference policy (off in DAPO)")
    kl_loss_coef: float = Field(0.001, ge=0.0)
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl", "mse"] = "low_var_kl"
    grad_clip: float = Field(1.0, gt=0.0)
    logprob_chunk_size: int = Field(1024, gt=0, description="tokens per chunk of the logits -> log-prob computation")
    gradient_checkpointing: bool = False
    dtype: Literal["fp32", "bf16"] = "fp32"
    optim: OptimConfig = Field(default_factory=OptimConfig)
    router_replay: RouterReplayConfig = Field(default_factory=RouterReplayConfig)
    router_aux_loss_coef: float = Field(
        0.0,
        ge=0.0,
        description="MoE: the update adds this times the router's load-balancing auxiliary loss (the Hugging Face "
        "model's own, as with output_router_logits; logged as moe/aux_loss); 0 = off",
    )

    @model_validator(mode="after")
    def _loss_knobs_are_keys(self) -> "ActorConfig":
        # A registered loss names the keys it reads (PolicyLoss.knobs) and the paper values it takes; each must be a
        # key of this schema (its field holds the default and the checks), and each paper value must pass that field.
        loss = registered_policy_loss(self.policy_loss.loss_mode)
        where = f"actor.policy_loss.loss_mode={loss.name}"
        for knob in loss.knobs:
            if _actor_field(knob) is None:
                raise ValueError(f"{where} reads actor.{knob}, which is not a config key")
            if knob_parameter(knob) not in knob_parameters():
                raise ValueError(f"{where} reads actor.{knob}, which PolicyLossParams has no field for")
        for key, value in loss.paper_defaults.items():
            info = type(self).model_fields.get(key)
            if info is None:
                raise ValueError(f"{where} has a paper default for actor.{key}, which is not a top-level actor key")
            try:
                TypeAdapter(Annotated[info.annotation, info]).validate_python(value)
            except ValidationError as error:
                problem = error.errors()[0]["msg"]
                raise ValueError(f"{where}: its paper default actor.{key}={value!r} is refused: {problem}") from None
        return self

    @model_validator(mode="after")
    def _loss_mode_defaults(self) -> "ActorConfig":
        # A key the input did not give (pydantic's model_fields_set: given by a file, an override, an alias or a verl
        # / TRL spelling) takes the loss mode's paper value, else the field's own default. Written into __dict__:
        # the values were validated by _loss_knobs_are_keys, and the key stays out of model_fields_set, which is how
        # paper_defaults_taken tells a taken default from a value the user chose.
        paper = registered_policy_loss(self.policy_loss.loss_mode).paper_defaults
        for key in _mode_defaulted_keys():
            if key not in self.model_fields_set:
                self.__dict__[key] = paper.get(key, type(self).model_fields[key].default)
        return self

    def paper_defaults_taken(self) -> dict[str, float | str]:
        """The keys whose value is ``policy_loss.loss_mode``'s paper default because the config did not set them."""
        return {
            k: v
            for k, v in registered_policy_loss(self.policy_loss.loss_mode).paper_defaults.items()
            if k not in self.model_fields_set
        }

    @model_validator(mode="after")
    def _micro_batch_given(self) -> "ActorConfig":
        if not self.use_dynamic_bsz and self.ppo_micro_batch_size_per_gpu is None:
            raise ValueError("actor.ppo_micro_batch_size_per_gpu is required when actor.use_dynamic_bsz is false")
        return self

    @model_validator(mode="after")
    def _shared_prompt_is_not_sharded(self) -> "ActorConfig":
        # An FSDP2 actor pairs one all-gather / reduce-scatter per layer with one forward; the shared-prompt layout
        # runs several forwards per micro-batch. Refused here, at the edge, not at the first update.
        if self.layout == "shared_prompt" and self.strategy == "fsdp2":
            raise ValueError(
                "actor.layout=shared_prompt cannot run with actor.strategy=fsdp2; use auto (padded there) or padded"
            )
        return self

    @model_validator(mode="after")
    def _fsdp_keys_need_fsdp2(self) -> "ActorConfig":
        # A replicated actor ignores these keys; silently training without the asked-for offload or precision would
        # mislead, so a changed value without the strategy that reads it is an error.
        if self.strategy != "fsdp2" and self.fsdp != FsdpConfig():
            changed = sorted(k for k, v in self.fsdp.model_dump().items() if v != FsdpConfig().model_dump()[k])
            raise ValueError(
                f"actor.fsdp.{', actor.fsdp.'.join(changed)} only apply with actor.strategy=fsdp2 "
                f"(it is {self.strategy})"
            )
        return self


# ---------------------------------------------------------------------------------------- algorithm
class SkipSolvedPromptsConfig(_Section):
    """Skip prompts before generation that every sample solved in each of their last `epochs` epochs (a per-prompt
    pass-rate record, saved in checkpoints): their group would likely be all-correct, which Eq. 11 drops."""

    enable: bool = Field(
        False,
        description="keep a per-prompt pass-rate record and skip prompts solved by every "
        "sample in each of their last `epochs` epochs (an epoch with fewer unsolved prompts than a "
        "generation batch skips nothing)",
    )
    epochs: int = Field(
        1, ge=1, description="k: epochs (those the prompt was seen in) it must have been fully solved in"
    )


class FilterGroupsConfig(_Section):
    """Dynamic Sampling (Eq. 11)."""

    enable: bool = Field(True, description="drop groups whose accuracies are all 0 or all 1")
    metric: Literal["acc"] = Field("acc", description="decided on raw accuracy, never on the shaped reward")
    max_num_gen_batches: int = Field(10, description="generation rounds per step before giving up; <= 0 = unlimited")
    on_exhausted: Literal["error", "train_on_partial"] = Field(
        "error", description="when max_num_gen_batches is reached: stop with a message, or train on what was kept"
    )
    carry_over_surplus: bool = Field(
        False, description="keep surplus groups for the next step instead of dropping them"
    )
    skip_solved_prompts: SkipSolvedPromptsConfig = Field(default_factory=SkipSolvedPromptsConfig)


RolloutRSMode = Literal[
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
]


def _bounds(where: str, spec: float | str, *, band_allowed: bool) -> tuple[float, float | None]:
    """``(upper, lower)`` of a verl threshold: a number (upper only) or a ``"lower_upper"`` string (a band)."""
    if isinstance(spec, str):
        parts = spec.strip().split("_")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ValueError(f"{where}={spec!r}: expected a number or 'lower_upper' (e.g. '0.5_2.0')") from None
        if len(values) == 1:
            return _bounds(where, values[0], band_allowed=band_allowed)
        if len(values) != 2:
            raise ValueError(f"{where}={spec!r}: expected a number or 'lower_upper' (e.g. '0.5_2.0')")
        if not band_allowed:
            raise ValueError(f"{where}={spec!r}: this mode bounds a divergence from above, give one number")
        lower, upper = values
        if not 0 < lower <= upper:
            raise ValueError(f"{where}={spec!r}: need 0 < lower <= upper")
        return upper, lower
    if not spec > 0:
        raise ValueError(f"{where} must be > 0, got {spec}")
    return float(spec), None


class RolloutCorrectionConfig(_Section):
    """Train/inference mismatch correction between the rollout engine and the actor (verl's names and strings;
    ``dapo.core.rollout_correction``, docs/objectives.md)."""

    rollout_is: Literal["token", "sequence"] | None = Field(
        None,
        description="weight the PPO loss by pi_old/mu per token or per sequence (TIS: min(w, C); with a "
        "'lower_upper' threshold IcePop: 0 outside the band); None = off",
    )
    rollout_is_threshold: float | str = Field(
        2.0, description="C, the truncation bound of the weight, or 'lower_upper' (e.g. '0.5_2.0') for IcePop's band"
    )
    rollout_rs: RolloutRSMode | None = Field(
        None,
        description="rejection sampling: token_k1/k2/k3, seq_sum_k1/k2/k3, seq_mean_k1/k2/k3 (seq_mean_k1 = "
        "Geo-RS, geometric-mean ratio), seq_max_k2/k3; rejected tokens or responses leave the loss; None = off",
    )
    rollout_rs_threshold: float | str | None = Field(
        None,
        description="bound of rollout_rs: k1 modes a ratio 'lower_upper' (one number u means 1/u_u); k2/k3 an "
        "upper bound of the divergence",
    )
    bypass_mode: bool = Field(
        False,
        description="pi_old = the engine's log-probs, no old-log-prob pass: the PPO ratio pi/mu then "
        "carries the correction itself (verl's bypass_mode with loss_type=ppo_clip)",
    )

    @model_validator(mode="after")
    def _thresholds_parse(self) -> "RolloutCorrectionConfig":
        self.is_bounds()
        if self.rollout_rs is not None:
            if self.rollout_rs_threshold is None:
                raise ValueError(
                    f"algorithm.rollout_correction.rollout_rs={self.rollout_rs} needs "
                    "rollout_rs_threshold (k1: e.g. '0.999_1.001'; k2/k3: an upper bound)"
                )
            self.rs_bounds()
        if self.bypass_mode and (self.rollout_is is not None or self.rollout_rs is not None):
            raise ValueError(
                "algorithm.rollout_correction.bypass_mode=true makes pi_old the engine's log-probs, so "
                "pi_old/mu is 1 and rollout_is / rollout_rs have nothing to weigh or reject; set them to "
                "null (the PPO ratio pi/mu and its clip are the correction in bypass mode)"
            )
        return self

    def is_bounds(self) -> tuple[float, float | None]:
        """``(C, lower)`` of ``rollout_is``: lower is None for TIS, IcePop's band start otherwise."""
        return _bounds(
            "algorithm.rollout_correction.rollout_is_threshold", self.rollout_is_threshold, band_allowed=True
        )

    def rs_bounds(self) -> tuple[float, float | None]:
        """``(upper, lower)`` of ``rollout_rs``; a k1 mode given one number u gets the band [1/u, u]."""
        assert self.rollout_rs is not None and self.rollout_rs_threshold is not None
        k1 = self.rollout_rs.endswith("k1")
        upper, lower = _bounds(
            "algorithm.rollout_correction.rollout_rs_threshold", self.rollout_rs_threshold, band_allowed=k1
        )
        return (upper, 1.0 / upper if lower is None else lower) if k1 else (upper, None)


class AlgorithmConfig(_Section):
    adv_estimator: Literal["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk"] = Field(
        "grpo",
        description="grpo (DAPO Eq. 9; Dr. GRPO with norm_adv_by_std_in_grpo=false), rloo (leave-one-out "
        "baseline), reinforce_plus_plus (batch token whitening), reinforce_plus_plus_baseline (group mean, then "
        "token whitening), grpo_passk (only each group's best response learns); see docs/objectives.md",
    )
    norm_adv_by_std_in_grpo: bool = Field(True, description="False = Dr. GRPO (no std division)")
    filter_groups: FilterGroupsConfig = Field(default_factory=FilterGroupsConfig)
    overlong_filter: bool = Field(False, description="mask truncated samples out of the loss (overlong filtering)")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)


# ------------------------------------------------------------------------------------------- reward
class OverlongBufferConfig(_Section):
    """Soft overlong punishment (Eq. 13)."""

    enable: bool = True
    len: int = Field(16, gt=0, description="L_cache: the buffer before max_response_length")
    penalty_factor: float = Field(1.0, ge=0.0)
    log: bool = False


class RewardModelConfig(_Section):
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)
    num_workers: int = Field(0, ge=0, description="reward process-pool size (0 = in-process)")
    timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="hard per-sample limit of a reward call, in every mode (a custom reward function "
        "runs in a worker process even with num_workers=0)",
    )
    on_failure: Literal["score_as_failed", "stop"] = Field(
        "score_as_failed",
        description="a reward call that times out, crashes its worker or raises: score it -1 / "
        "wrong and continue (counted in reward/timeouts, reward/worker_crashes, reward/errors), or stop the run; "
        "a batch where every call fails always stops",
    )
    max_failures: int | None = Field(
        100,
        ge=0,
        description="with on_failure=score_as_failed: stop once more than this many reward calls of the "
        "run failed (None = no limit)",
    )
    compat: Literal["improved", "reference"] = Field(
        "improved",
        description="math_dapo/AIME/DAPO-17k scorer: 'improved' (dapo.reward.math_dapo, the fixes in "
        "docs/reward.md) or 'reference' (the published verl/DAPO scorer exactly, for numbers comparable with the paper)",
    )


class CustomRewardFunctionConfig(_Section):
    path: str | None = Field(None, description="a .py file holding the function")
    name: str = Field("compute_score", description="the function's name in that file")


# ------------------------------------------------------------------------------------------ async training
class AsyncTrainingConfig(_Section):
    """Overlapping generation with training (docs/async.md); verl's ``async_training.*`` key names."""

    mode: Literal["sync", "one_step_off", "fully_async"] = Field(
        "sync",
        description="sync: generate, then train (Algorithm 1 as written); one_step_off: a rollout worker "
        "process generates step k+1's batch with the weights of step k-1 while step k trains (every sample one "
        "version behind at most); fully_async: the worker generates continuously, each batch starting once the "
        "weights are at most staleness_threshold versions behind the actor that will train on it",
    )
    staleness_threshold: int = Field(
        1,
        ge=0,
        description="fully_async: how many weight pushes a sample's weights may lag behind the newest push "
        "the actor that trains it has passed (trigger_parameter_sync_step=1: versions behind that actor)",
    )
    partial_rollout: bool = Field(
        False,
        description="fully_async: a weight push interrupts in-flight generations, which resume under the new "
        "weights keeping the tokens produced (each token tagged with its version)",
    )
    partial_rollout_chunk_tokens: int = Field(
        8, gt=0, description="partial_rollout: tokens generated between two chances to load a push"
    )
    trigger_parameter_sync_step: int = Field(
        1,
        ge=1,
        description="async modes: trainer steps between weight pushes into the rollout worker (1: after "
        "every step; k: after every k-th and the last), staleness_threshold then counts pushes (docs/async.md)",
    )
    pi_old: Literal["recompute", "bypass"] = Field(
        "recompute",
        description="pi_old of off-policy samples: recompute = the actor's log-probs before the update "
        "(decoupled PPO: the proximal policy, the engine's log-probs stay the behaviour policy for "
        "algorithm.rollout_correction); bypass = the engine's sampling log-probs",
    )
    rollout_num_threads: int | None = Field(
        None, gt=0, description="torch threads of the rollout worker process (None: torch's default)"
    )


# ------------------------------------------------------------------------------------------ distillation
# The single-sample estimators of the reverse KL (dapo.core.kl.KL_ESTIMATORS' names) and the teacher-top-k forward KL;
# the registry of what each computes is dapo.core.distillation_losses.DISTILLATION_LOSSES.
SINGLE_SAMPLE_LOSS_MODES = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
TOPK_LOSS_MODES = ("forward_kl_topk",)


def is_served_teacher(model_path: str) -> bool:
    """A teacher given as an http(s) URL is an OpenAI-compatible server; anything else is a local model folder."""
    return model_path.startswith(("http://", "https://"))


class TeacherModelConfig(_Section):
    """One teacher of on-policy distillation (verl: ``distillation.teacher_models.<name>.*``)."""

    model_path: str = Field(
        ...,
        min_length=1,
        description="the teacher: a Hugging Face model folder (loaded once in the trainer, forward "
        "only), or the base URL of an OpenAI-compatible server that returns prompt log-probs for given token ids "
        "(`dapo serve`, `vllm serve`), e.g. http://127.0.0.1:8000/v1. It must share the student's tokenizer",
    )
    key: str | None = Field(
        None,
        min_length=1,
        description="routing value: samples whose distillation.teacher_key field equals it go to "
        "this teacher (required with several teachers; ignored with one)",
    )
    served_model_name: str | None = Field(
        None,
        min_length=1,
        description="(dapo only) a served teacher: the 'model' of its requests; None = the first "
        "model the server lists at /v1/models",
    )
    timeout_s: float = Field(120.0, gt=0.0, description="(dapo only) a served teacher: seconds one request may take")


class DistillationLossConfig(_Section):
    """How the teacher's log-probs become a training signal (verl: ``distillation.distillation_loss.*``)."""

    loss_mode: Literal["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "forward_kl_topk"] = Field(
        "k3",
        description="the per-token divergence D: a single-sample estimator of the reverse KL "
        "KL(student || teacher) at the sampled token (k1/kl: log pi_s - log pi_t; abs; k2/mse; k3/low_var_kl), or "
        "forward_kl_topk: the forward KL on the teacher's top-k tokens (needs use_policy_gradient=false)",
    )
    topk: int = Field(32, ge=1, le=1024, description="k of forward_kl_topk")
    use_task_rewards: bool = Field(
        True,
        description="true: the task reward's advantage (Eq. 9) is kept and the distillation signal added, times "
        "distillation_loss_coef; false: the distillation signal alone trains the student",
    )
    distillation_loss_coef: float = Field(
        1.0, ge=0.0, description="weight of the distillation signal when use_task_rewards=true (verl: only then)"
    )
    use_policy_gradient: bool = Field(
        False,
        description="true: PG OPD, the per-token advantage is -D (stop-gradient) fed to the policy loss "
        "(actor.policy_loss.loss_mode); false: D is a loss term backpropagated directly (GKD OPD)",
    )
    loss_max_clamp: float | None = Field(
        None, gt=0.0, description="clamp of the per-token distillation signal to [-c, c] (None: none)"
    )
    log_prob_min_clamp: float | None = Field(
        None,
        lt=0.0,
        description="lower clamp of the student's and teacher's log-probs before D is computed (None: none)",
    )


class DistillationConfig(_Section):
    """On-policy distillation (docs/distillation.md; verl's ``distillation.*`` keys): the student samples, the teacher
    scores exactly the student's tokens, and the reverse KL between them trains the student."""

    enabled: bool = Field(False, description="turn on-policy distillation on")
    teacher_key: str = Field(
        "data_source",
        min_length=1,
        description="the sample field that routes it to a teacher with several "
        "teachers: data_source or a key of the prompt's extra_info",
    )
    teacher_models: dict[str, TeacherModelConfig] = Field(
        default_factory=dict, description="the teachers by name (one: 'teacher_model' by verl's convention)"
    )
    distillation_loss: DistillationLossConfig = Field(default_factory=DistillationLossConfig)

    @model_validator(mode="after")
    def _teachers_make_sense(self) -> "DistillationConfig":
        loss = self.distillation_loss
        if not self.enabled:
            return self
        if not self.teacher_models:
            raise ValueError(
                "distillation.enabled=true needs a teacher: set "
                "distillation.teacher_models.teacher_model.model_path (a model folder or a server URL)"
            )
        if len(self.teacher_models) > 1:
            keys = [t.key for t in self.teacher_models.values()]
            missing = sorted(n for n, t in self.teacher_models.items() if t.key is None)
            if missing:
                raise ValueError(
                    f"distillation.teacher_models: with several teachers each needs a routing key; "
                    f"set distillation.teacher_models.{missing[0]}.key"
                )
            if len(set(keys)) != len(keys):
                raise ValueError(f"distillation.teacher_models: two teachers share a routing key ({keys})")
        if loss.loss_mode in TOPK_LOSS_MODES and loss.use_policy_gradient:
            raise ValueError(
                f"distillation.distillation_loss.loss_mode={loss.loss_mode} needs "
                "use_policy_gradient=false: a policy-gradient update acts through the sampled token "
                "only, so the teacher's top-k distribution would be unused"
            )
        if loss.loss_mode in ("k1", "kl") and not loss.use_policy_gradient:
            raise ValueError(
                f"distillation.distillation_loss.loss_mode={loss.loss_mode} needs use_policy_gradient="
                "true: backpropagated directly, k1's gradient is the score function alone (its "
                "expectation is 0), so the teacher would not move the student"
            )
        served = sorted(n for n, t in self.teacher_models.items() if is_served_teacher(t.model_path))
        if loss.loss_mode in TOPK_LOSS_MODES and served:
            raise ValueError(
                f"distillation.distillation_loss.loss_mode={loss.loss_mode}: the served teacher "
                f"'{served[0]}' returns the sampled token's log-prob only here; use a local teacher "
                "folder for the top-k forward KL"
            )
        return self


# ------------------------------------------------------------------------------------------ trainer
class TrainerConfig(_Section):
    total_training_steps: int | None = Field(30, gt=0, description="steps to train (None = total_epochs passes)")
    total_epochs: int = Field(1, gt=0)
    test_freq: int = Field(5, description="validate every N steps (<= 0: never, except at the end)")
    val_before_train: bool = True
    save_freq: int = Field(-1, description="checkpoint every N steps (<= 0: only at the end)")
    max_ckpt_to_keep: int | None = Field(2, gt=0)
    checkpoint_format: Literal["auto", "full", "sharded"] = Field(
        "auto",
        description="'full': rank 0 gathers the whole model and optimizer and writes them (hf/, "
        "optimizer.pt); 'sharded': every rank writes its own FSDP2 shards with torch.distributed.checkpoint, rank 0 "
        "a streamed hf/ export (actor.strategy=fsdp2 only); 'auto': sharded under fsdp2, else full. Either resumes on "
        "any world size and strategy (docs/checkpoints.md)",
    )
    resume_mode: str = Field("auto", description="'auto' (latest complete checkpoint), 'disable', or a checkpoint path")
    logger: list[Literal["console", "jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["jsonl", "tensorboard"],
        description="metric sinks; 'console' prints every metric each step (the progress line is always shown)",
    )
    progress: bool = Field(True, description="live status line: step, reward, accuracy, entropy, length, time left")
    project_name: str = "dapo"
    experiment_name: str = "tiny-synth"
    default_local_dir: str = Field("runs", description="run directories live at default_local_dir/experiment_name")
    rollout_data_dir: str | None = Field(
        None,
        description="write every step's training batch (after dynamic sampling) to <dir>/<step>.jsonl, one line "
        "per sample: prompt, response, ground truth, score, accuracy, and under async_training the weight version of "
        "each token and the sample's lag (None: not written)",
    )
    profile_steps: list[PositiveInt] = Field(
        default_factory=list,
        description="steps to run under torch.profiler: each phase that runs the model "
        "(generation, reward, old-log-prob pass, update, weight push) gets its operators by self time in "
        "<run dir>/profile/step<K>.json and .txt (docs/performance.md); [] = none",
    )
    stall_timeout_s: float = Field(
        300.0,
        gt=0,
        description="the longest the trainer waits on another process (the rollout worker's generation, "
        "weight push and probe) without a sign of progress from it (the worker sends one every few seconds while it "
        "runs); then the run stops with a message naming the stage and the peer",
    )
    max_consecutive_skipped_steps: int = Field(
        3,
        ge=0,
        description="stop with an error after this many consecutive optimizer steps skipped for a non-finite "
        "gradient norm (a run that skips every step trains nothing); 0 = never stop",
    )
    seed: int = 42
    device: Literal["auto", "cpu", "cuda"] = "auto"
    num_threads: int | None = Field(None, gt=0, description="torch CPU threads (None = torch's default)")
    resume_with_changes: bool = Field(
        False,
        description="resume a run directory whose config.yaml differs in hyper-parameters (otherwise the run "
        "stops and lists the changed keys); length, logging and checkpoint-frequency keys may always change",
    )


class DapoConfig(_Section):
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = Field(default_factory=CustomRewardFunctionConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    async_training: AsyncTrainingConfig = Field(default_factory=AsyncTrainingConfig)
    distillation: DistillationConfig = Field(default_factory=DistillationConfig)

    @property
    def filters_groups(self) -> bool:
        """Whether Dynamic Sampling's Eq. 11 drops groups. With distillation and the task reward off, no group is
        uninformative (each carries the teacher's per-token signal), so none is dropped (docs/distillation.md)."""
        ds = self.distillation
        reward_off = ds.enabled and not ds.distillation_loss.use_task_rewards
        return self.algorithm.filter_groups.enable and not reward_off

    def _true_on_policy_problems(self) -> list[str]:
        """What ``rollout.true_on_policy`` cannot run with: each one would make the engine and the actor compute
        different numbers (or the mode is not built there)."""
        r, key = self.rollout, "rollout.true_on_policy=true"
        found = []
        if self.async_training.mode != "sync":
            found.append(
                f"{key} runs with async_training.mode=sync (a rollout worker computing batch-invariantly in "
                "its own process is not built)"
            )
        if r.multi_turn.enable:
            found.append(f"{key} does not run rollout.multi_turn (tool turns are not batch-invariant yet)")
        if r.top_p < 1.0 or r.top_k > 0:
            found.append(
                f"{key} needs rollout.top_p=1.0 and rollout.top_k=-1: the actor's log-probs are of the full "
                "softmax, so the engine must sample from it"
            )
        if r.dtype != "auto":
            found.append(
                f"{key} needs rollout.dtype=auto: the engine computes in the actor's precision "
                f"(actor.dtype), not in rollout.dtype={r.dtype}"
            )
        if self.actor.layout == "shared_prompt":
            found.append(f"{key} runs the actor with actor.layout=packed, padded or auto, not shared_prompt")
        if self.model.lora and self.model.lora_dropout > 0:
            found.append(f"{key} needs model.lora_dropout=0: dropout makes the actor's forward random")
        return found

    def _router_replay_problems(self) -> list[str]:
        """What ``actor.router_replay.mode`` cannot run with, and why (each would replay wrong routes or none)."""
        mode = self.actor.router_replay.mode
        key, found = f"actor.router_replay.mode={mode}", []
        # actor.layout=shared_prompt runs: each of its passes replays its own tokens' routes (dapo.actor.log_probs)
        # actor.gradient_checkpointing runs: each layer's recomputation replays its forward's plan
        # (RouterTape.checkpoint_contexts, the context_fn dapo.actor.update.configure_model_for_training passes)
        # actor.strategy=fsdp2 runs in the synchronous loop: the engine's unsharded copy records on a tape of its own
        # (dapo.training.run.Run.routing_replay), each rank replays its share's routes inside the FSDP2 root
        # (tests/distributed/test_router_replay_fsdp_torchrun.py)
        if self.actor.strategy == "fsdp2" and self.async_training.mode != "sync":
            found.append(
                f"{key} under actor.strategy=fsdp2 runs with async_training.mode=sync (FSDP2 trainer ranks "
                "beside rollout ranks are not tested with replay); use actor.strategy=replicated there"
            )
        if self.rollout.true_on_policy:
            found.append(
                f"{key} is not needed with rollout.true_on_policy=true (the engine computes the actor's "
                "routes bitwise) and does not record under it"
            )
        # rollout.multi_turn runs: each call's routes are stitched onto the trajectory (dapo.rollout.sample_routes)
        return found

    @model_validator(mode="after")
    def _cross_section(self) -> "DapoConfig":
        problems: list[str] = []
        d = self.data
        if d.train_batch_size % self.actor.ppo_mini_batch_size != 0:
            problems.append(
                f"actor.ppo_mini_batch_size ({self.actor.ppo_mini_batch_size}) must divide "
                f"data.train_batch_size ({d.train_batch_size})"
            )
        ob = self.reward_model.overlong_buffer
        if ob.enable and ob.len > d.max_response_length:
            problems.append(
                f"reward_model.overlong_buffer.len ({ob.len}) must be <= data.max_response_length ({d.max_response_length})"
            )
        if self.algorithm.adv_estimator == "grpo_passk" and self.rollout.n < 2:
            problems.append("algorithm.adv_estimator=grpo_passk needs rollout.n >= 2 (a best and a second best)")
        if self.algorithm.filter_groups.enable and self.rollout.n < 2:
            problems.append("algorithm.filter_groups.enable needs rollout.n >= 2 (a group of one is never kept)")
        rc = self.algorithm.rollout_correction
        if self.actor.recompute_old_log_prob == "never" and rc.rollout_is is not None:
            problems.append(
                "algorithm.rollout_correction.rollout_is weighs pi_old against the engine's log-probs, so it needs "
                "actor.recompute_old_log_prob=auto or always (never makes pi_old the engine's log-probs: weight 1)"
            )
        at = self.async_training
        if at.mode != "sync" and self.actor.strategy == "fsdp2" and self.rollout.n_gpus_per_node == 0:
            problems.append(
                f"async_training.mode={at.mode} with actor.strategy=fsdp2 shards the actor over trainer "
                "ranks of a torchrun job beside rollout ranks of its own: set rollout.n_gpus_per_node=R "
                "(torchrun --nproc-per-node N+R, N >= 2 trainer ranks)"
            )
        if at.mode == "sync" and at.trigger_parameter_sync_step != 1:
            # The synchronous loop generates every batch with the actor that trains on it; fewer pushes would make
            # its samples silently stale, without the async modes' versions, bound and pi_old recomputation.
            problems.append(
                f"async_training.trigger_parameter_sync_step={at.trigger_parameter_sync_step} needs "
                "async_training.mode=one_step_off or fully_async (sync pushes after every step)"
            )
        if at.partial_rollout and at.mode != "fully_async":
            problems.append(
                "async_training.partial_rollout=true needs async_training.mode=fully_async (only there "
                "does a push arrive while a generation runs)"
            )
        if self.actor.recompute_old_log_prob == "never" and rc.rollout_rs is not None:
            problems.append(
                "algorithm.rollout_correction.rollout_rs compares pi_old with the engine's log-probs, so it needs "
                "actor.recompute_old_log_prob=auto or always (never makes pi_old the engine's log-probs)"
            )
        if rc.bypass_mode and self.actor.recompute_old_log_prob == "always":
            problems.append(
                "algorithm.rollout_correction.bypass_mode=true skips the old-log-prob pass; it cannot be "
                "combined with actor.recompute_old_log_prob=always"
            )
        truncated = self.rollout.top_p < 1.0 or self.rollout.top_k > 0
        compares = [
            name
            for name, on in (
                ("algorithm.rollout_correction.rollout_is", rc.rollout_is is not None),
                ("algorithm.rollout_correction.rollout_rs", rc.rollout_rs is not None),
                ("algorithm.rollout_correction.bypass_mode", rc.bypass_mode),
                ("actor.recompute_old_log_prob=never", self.actor.recompute_old_log_prob == "never"),
            )
            if on
        ]
        if truncated and compares:
            # trl#6789: the engine reports log-probs of the top-p/top-k truncated distribution it sampled from, the
            # actor computes the full softmax, so their ratio is biased by the truncated mass on every token.
            problems.append(
                f"{compares[0]} compares the actor's log-probs with the engine's, but "
                f"rollout.top_p={self.rollout.top_p} / rollout.top_k={self.rollout.top_k} make the engine report "
                "log-probs of the truncated distribution while the actor computes the full softmax: every ratio "
                "would be biased (trl#6789). Sample with top_p=1.0 and top_k=-1 for training, or turn the "
                "correction off"
            )
        if self.rollout.true_on_policy:
            problems.extend(self._true_on_policy_problems())
        if self.actor.router_replay.mode != "disabled":
            problems.extend(self._router_replay_problems())
        if self.actor.router_aux_loss_coef > 0 and self.actor.layout == "shared_prompt":
            problems.append(
                "actor.router_aux_loss_coef > 0 runs the actor with actor.layout=padded, packed or auto (the "
                "auxiliary loss is over one forward's tokens; the shared-prompt passes are not built for it)"
            )
        if self.actor.router_aux_loss_coef > 0 and self.actor.gradient_checkpointing:
            problems.append(
                "actor.router_aux_loss_coef > 0 cannot run with actor.gradient_checkpointing=true (the router "
                "logits it captures inside a checkpointed layer are not what backward recomputes; untested)"
            )
        ds = self.distillation
        if ds.enabled and ds.distillation_loss.loss_mode in TOPK_LOSS_MODES and self.rollout.multi_turn.enable:
            problems.append(
                "distillation.distillation_loss.loss_mode=forward_kl_topk with rollout.multi_turn is not "
                "built; use a single-sample mode (k1 with use_policy_gradient=true, or k3)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
