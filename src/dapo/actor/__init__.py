"""The actor: PPO updates of a Hugging Face causal LM from (prompt, response, advantage) samples.

``TrainBatch`` holds the samples; ``update_policy`` runs the DAPO update (mini-batches of whole prompt groups,
padding-free micro-batches, clipped token-level loss); ``compute_log_probs_batch`` gives the old log-probs;
``build_optimizer`` / ``build_lr_scheduler`` make AdamW and its warm-up schedule.
"""

from dapo.actor.batch import TrainBatch, pad_per_token
from dapo.actor.log_probs import (
    compute_log_probs_and_entropy_batch,
    compute_log_probs_batch,
    compute_response_log_probs,
)
from dapo.actor.micro_batching import MicroBatchPlan, pack_by_token_budget, plan_micro_batches, split_fixed_size
from dapo.actor.optim import build_lr_scheduler, build_optimizer
from dapo.actor.update import NonFiniteLossError, accumulate_mini_batch_gradients, update_policy

__all__ = [
    "MicroBatchPlan",
    "NonFiniteLossError",
    "TrainBatch",
    "accumulate_mini_batch_gradients",
    "build_lr_scheduler",
    "build_optimizer",
    "compute_log_probs_and_entropy_batch",
    "compute_log_probs_batch",
    "compute_response_log_probs",
    "pack_by_token_budget",
    "pad_per_token",
    "plan_micro_batches",
    "split_fixed_size",
    "update_policy",
]
