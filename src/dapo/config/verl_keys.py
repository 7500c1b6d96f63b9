"""verl's config keys that are not spelled as this tree spells them: what each one does here, and why.

Every key of verl's DAPO recipes (``recipe/dapo/run_dapo_qwen2.5_32b.sh``, ``run_dapo_early_qwen2.5_32b.sh``,
``test_dapo_7b.sh``, ``test_dapo_7b_math.sh``; their flags are in ``tests/fixtures/verl/``) is one of:

* **honoured** — the same name exists in this tree (after the ``actor_rollout_ref.*`` prefix mapping in
  ``dapo.config.loading``) and means what it means in verl; not listed here;
* **renamed** — verl's name for one of our keys, possibly with its value translated (``RENAMED``);
* **fixed** — a verl setting whose behaviour is the only one here: accepted when it has the value that matches,
  rejected with the reason otherwise (``FIXED``);
* **warned** — accepted with a one-line warning that says why it does not apply here (``WARNED``);
* **expanded** — a TRL ``GRPOConfig`` name whose one value sets several of our keys (``EXPANDED``; TRL's flat names,
  e.g. ``loss_type=cispo``, ``importance_sampling_level=sequence``; docs/objectives.md).

``docs/config.md`` renders these tables (``scripts/write_config_doc.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = [
    "EXPANDED",
    "FIXED",
    "MATCHES",
    "RENAMED",
    "VALUES",
    "WARNED",
    "Expanded",
    "Fixed",
    "Matches",
    "Renamed",
    "Value",
    "Warned",
    "lookup",
]


@dataclass(frozen=True)
class Renamed:
    """verl's ``key`` is our ``target``; ``translate`` maps verl's value to ours (None: unchanged)."""

    key: str
    target: str
    why: str
    translate: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Fixed:
    """A verl key whose only supported value(s) are ``allowed`` (what this trainer always does)."""

    key: str
    allowed: tuple[Any, ...]
    why: str


@dataclass(frozen=True)
class Warned:
    """A verl key (or, ending in '.', a whole verl section) accepted without effect; ``why`` says why."""

    key: str
    why: str


@dataclass(frozen=True)
class Matches:
    """A verl key that must equal our key ``other`` (the value this trainer uses for it); rejected otherwise."""

    key: str
    other: str
    why: str


@dataclass(frozen=True)
class Expanded:
    """A TRL key whose value sets several of our keys: ``expand`` maps it to ``{our key: value}`` (``ValueError``
    with the allowed values otherwise)."""

    key: str
    why: str
    expand: Callable[[Any], dict[str, Any]]


@dataclass(frozen=True)
class Value:
    """One of our keys whose verl spelling of a value is translated (``translate``), e.g. a string for a list."""

    key: str
    why: str
    translate: Callable[[Any], Any]


def _token_level(value: Any) -> Any:
    # verl's pre-0.3 switch: True = token-level loss (DAPO Eq. 12), False = per-sample mean (GRPO, "early" DAPO).
    if isinstance(value, bool):
        return "token-mean" if value else "seq-mean-token-mean"
    return value


_WORLD_FROM_TORCHRUN = (
    "the ranks come from torchrun (--nproc-per-node, --nnodes; docs/distributed.md), not from the config"
)
_FSDP_KEYS = (
    "dapo's FSDP2 settings are actor.strategy=fsdp2 and actor.fsdp.{param_dtype,reduce_dtype,cpu_offload} "
    "(docs/distributed.md); verl's fsdp_config keys are not read"
)
_NO_REF = (
    "no reference model is loaded here: DAPO drops the KL term (actor.use_kl_loss=false, "
    "algorithm.use_kl_in_reward=false)"
)
_TEACHER_POOL = (
    "no teacher resource pool: a local teacher runs in the trainer process, on its device; a served "
    "teacher is sized by its own server"
)
_DISTILL_CLIP = (
    "PG OPD uses the actor's clip range (actor.clip_ratio_low / clip_ratio_high, Clip-Higher) for the "
    "distillation advantage as for the reward's"
)
_ACTOR_RECOMPUTES = (
    "the old-policy log-probs are recomputed by the actor, micro-batched by actor.use_dynamic_bsz "
    "and actor.ppo_max_token_len_per_gpu"
)

# ----------------------------------------------------------------------------------- the objective (issue 20)
# TRL's GRPOConfig.loss_type names a policy loss and an aggregation at once (docs/objectives.md, "Aggregation names").
_TRL_LOSS_TYPES: dict[str, tuple[str, str]] = {
    "grpo": ("vanilla", "seq-mean-token-mean"),
    "dr_grpo": ("vanilla", "seq-mean-token-sum-norm"),
    "dapo": ("vanilla", "token-mean"),
    "bnpo": ("vanilla", "token-mean"),
    "cispo": ("cispo", "token-mean"),
    "sapo": ("sapo", "seq-mean-token-mean"),
}


def _trl_loss_type(value: Any) -> dict[str, Any]:
    if value not in _TRL_LOSS_TYPES:
        raise ValueError(f"allowed: {', '.join(_TRL_LOSS_TYPES)}")
    mode, agg = _TRL_LOSS_TYPES[value]
    return {"actor.policy_loss.loss_mode": mode, "actor.loss_agg_mode": agg}


def _trl_importance_sampling_level(value: Any) -> dict[str, Any]:
    if value not in ("token", "sequence"):
        raise ValueError("allowed: token, sequence")
    return {"actor.policy_loss.loss_mode": "gspo" if value == "sequence" else "vanilla"}


def _trl_scale_rewards(value: Any) -> Any:
    # TRL: True / "group" = divide by the group std (GRPO), False / "none" = do not (Dr. GRPO); "batch" (the batch
    # std) has no counterpart here and is left for the validation to reject with the allowed values.
    return {"group": True, "none": False}.get(value, value) if isinstance(value, str) else value


EXPANDED: tuple[Expanded, ...] = (
    Expanded(
        "loss_type",
        "TRL's GRPOConfig.loss_type: grpo, dr_grpo, dapo, bnpo (vanilla with their aggregation), "
        "cispo, sapo; sets actor.policy_loss.loss_mode and actor.loss_agg_mode",
        _trl_loss_type,
    ),
    Expanded(
        "importance_sampling_level",
        "TRL's GSPO switch: sequence = actor.policy_loss.loss_mode=gspo, token = vanilla",
        _trl_importance_sampling_level,
    ),
)

RENAMED: tuple[Renamed, ...] = (
    Renamed("epsilon", "actor.clip_ratio_low", "TRL's GRPOConfig name of eps_low"),
    Renamed("epsilon_high", "actor.clip_ratio_high", "TRL's GRPOConfig name of eps_high (Clip-Higher)"),
    Renamed(
        "scale_rewards",
        "algorithm.norm_adv_by_std_in_grpo",
        "TRL's GRPOConfig switch: true / group = divide by the group std, false / none = Dr. GRPO",
        _trl_scale_rewards,
    ),
    Renamed(
        "model.enable_gradient_checkpointing",
        "actor.gradient_checkpointing",
        "verl keeps gradient checkpointing under the model section",
    ),
    Renamed(
        "actor.use_token_level_loss",
        "actor.loss_agg_mode",
        "verl's older switch: true = token-mean (DAPO Eq. 12), false = seq-mean-token-mean",
        _token_level,
    ),
    Renamed(
        "actor.ppo_micro_batch_size",
        "actor.ppo_micro_batch_size_per_gpu",
        "verl's deprecated global micro-batch size; on one device global = per GPU (null = unset)",
    ),
    Renamed(
        "custom_reward_function.overlong_buffer.",
        "reward_model.overlong_buffer.",
        "where older verl DAPO scripts put the overlong buffer (Eq. 13)",
    ),
    Renamed(
        "reward_model.reward_kwargs.overlong_buffer_cfg.",
        "reward_model.overlong_buffer.",
        "the overlong buffer as verl.trainer.main_ppo's DAPO reward manager takes it",
    ),
)

FIXED: tuple[Fixed, ...] = (
    Fixed(
        "algorithm.rollout_correction.loss_type",
        ("ppo_clip",),
        "the correction always sits under the PPO-style loss of actor.policy_loss.loss_mode (verl's 'reinforce' "
        "loss is not implemented)",
    ),
    Fixed(
        "algorithm.rollout_correction.rollout_is_batch_normalize",
        (False,),
        "the importance weights are not renormalised to mean 1",
    ),
    Fixed("data.prompt_key", ("prompt",), "prompts are read from the DAPO schema's 'prompt' column"),
    Fixed("algorithm.use_kl_in_reward", (False,), "KL-in-reward is not implemented (DAPO removes the KL term)"),
    Fixed(
        "rollout.val_kwargs.do_sample",
        (True,),
        "validation always samples (for greedy decoding set rollout.val_kwargs.temperature=0)",
    ),
    Fixed(
        "reward_model.reward_manager",
        ("dapo",),
        "the reward is always DAPO's: rule reward per data_source plus reward_model.overlong_buffer",
    ),
    Fixed(
        "model.use_remove_padding",
        (True,),
        "the actor always packs sequences without padding (use_remove_padding=false is not available)",
    ),
    Fixed(
        "distillation.distillation_loss.policy_loss_mode",
        ("vanilla",),
        "PG OPD feeds the distillation advantage to actor.policy_loss.loss_mode (vanilla: DAPO Eq. 10), as verl "
        "supports vanilla only",
    ),
)

WARNED: tuple[Warned, ...] = (
    Warned(
        "data.truncation",
        "prompts are never truncated here: longer than data.max_prompt_length is dropped or "
        "an error (data.filter_overlong_prompts)",
    ),
    Warned("algorithm.kl_ctrl.", "KL-in-reward is off (algorithm.use_kl_in_reward=false), so verl ignores it too"),
    Warned("actor.fsdp_config.", _FSDP_KEYS),
    Warned("actor_rollout_ref.ref.", _NO_REF),
    Warned("actor.ulysses_sequence_parallel_size", "no sequence parallelism: every rank holds whole sequences"),
    Warned("rollout.log_prob_use_dynamic_bsz", _ACTOR_RECOMPUTES),
    Warned("rollout.log_prob_max_token_len_per_gpu", _ACTOR_RECOMPUTES),
    Warned("rollout.log_prob_micro_batch_size", _ACTOR_RECOMPUTES),
    Warned("rollout.log_prob_micro_batch_size_per_gpu", _ACTOR_RECOMPUTES),
    Warned("rollout.enable_chunked_prefill", "not passed to vLLM; vLLM's own default applies (on in vLLM V1)"),
    Warned(
        "model.override_config.",
        "not applied: the model's own config.json is used (Qwen2.5 already has "
        "attention_dropout=0 and no embd_pdrop/resid_pdrop; for a longer context pick a model whose "
        "max_position_embeddings covers it)",
    ),
    Warned("trainer.n_gpus_per_node", _WORLD_FROM_TORCHRUN),
    Warned("trainer.nnodes", _WORLD_FROM_TORCHRUN),
    Warned(
        "trainer.log_val_generations",
        "validation samples are not sent to the trackers; `dapo eval` writes every sample to JSONL",
    ),
    Warned("distillation.n_gpus_per_node", _TEACHER_POOL),
    Warned("distillation.nnodes", _TEACHER_POOL),
    Warned("distillation.teacher_models.*.num_replicas", _TEACHER_POOL),
    Warned(
        "distillation.teacher_models.*.inference.",
        "a local teacher runs forward passes in the trainer "
        "(actor.* micro-batching and dtype); a served one is whatever its server runs",
    ),
    Warned("distillation.distillation_loss.clip_ratio", _DISTILL_CLIP),
    Warned("distillation.distillation_loss.clip_ratio_low", _DISTILL_CLIP),
    Warned("distillation.distillation_loss.clip_ratio_high", _DISTILL_CLIP),
    Warned(
        "distillation.distillation_loss.loss_agg_mode",
        "the distillation term is aggregated with actor.loss_agg_mode, as the policy loss",
    ),
    Warned("distillation.distillation_loss.global_batch_info.", "verl's internal field, filled at run time"),
    Warned("distillation.distillation_loss.loss_settings.", "verl's internal field, filled at run time"),
)


def _file_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _overlong_prompts(value: Any) -> Any:
    # verl: True = drop prompts over max_prompt_length; False = keep them and truncate (or fail, truncation=error).
    if isinstance(value, bool):
        return "drop" if value else "error"
    return value


def _warmup_steps(value: Any) -> Any:
    # verl: a negative lr_warmup_steps defers to lr_warmup_steps_ratio, whose default (0.0) means no warm-up.
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return 0
    return value


def _logger_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


VALUES: tuple[Value, ...] = (
    Value("data.train_files", "a single path, as verl accepts, is a one-file list", _file_list),
    Value("data.val_files", "a single path, as verl accepts, is a one-file list", _file_list),
    Value(
        "data.filter_overlong_prompts",
        "verl's boolean: true = drop, false = error (prompts are never truncated here)",
        _overlong_prompts,
    ),
    Value(
        "actor.optim.lr_warmup_steps",
        "verl's -1 (defer to lr_warmup_steps_ratio, default 0) = no warm-up",
        _warmup_steps,
    ),
    Value("trainer.logger", "a single logger name is a one-logger list", _logger_list),
)

MATCHES: tuple[Matches, ...] = (
    Matches(
        "reward_model.reward_kwargs.max_resp_len",
        "data.max_response_length",
        "the overlong penalty (Eq. 13) is measured against data.max_response_length",
    ),
)


def value_translation(key: str) -> Value | None:
    return next((v for v in VALUES if v.key == key), None)


def _matches(pattern: str, key: str) -> bool:
    """``pattern`` names ``key``: equal, or a section prefix (ending in '.') of it; a ``*`` part stands for any one
    part (a name the user chose, e.g. a teacher's in ``distillation.teacher_models.*.num_replicas``)."""
    want, have = pattern.rstrip(".").split("."), key.split(".")
    if len(have) < len(want) or (len(have) > len(want) and not pattern.endswith(".")):
        return False
    return all(w in ("*", h) for w, h in zip(want, have))


def lookup(key: str) -> Renamed | Expanded | Fixed | Matches | Warned | None:
    """The entry for a (prefix-mapped) dotted key, exact keys before section prefixes; None if not listed."""
    for table in (RENAMED, EXPANDED, FIXED, MATCHES, WARNED):
        for entry in table:
            if "*" in entry.key and _matches(entry.key, key):
                return entry
            if entry.key == key or (entry.key.endswith(".") and key.startswith(entry.key)):
                return entry
    return None
