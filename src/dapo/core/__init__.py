"""The DAPO algorithm core: pure tensor math (advantages, policy loss, loss aggregation, overlong shaping, dynamic
sampling decisions, rollout importance weights, KL and entropy). torch only; no models, no I/O."""

from dapo.core.advantages import (
    ADV_ESTIMATORS,
    AdvantageEstimator,
    broadcast_advantage,
    compute_grpo_outcome_advantage,
    get_adv_estimator,
    register_adv_estimator,
)
from dapo.core.dynamic_sampling import GroupFilterResult, filter_informative_groups
from dapo.core.kl import KL_ESTIMATORS, entropy_from_logits, kl_penalty
from dapo.core.loss_aggregation import LOSS_AGG_MODES, aggregate_loss, count_loss_normalizers
from dapo.core.masked import masked_mean, masked_sum
from dapo.core.overlong import compute_soft_overlong_penalty, overlong_filter_mask
from dapo.core.policy_loss import (
    POLICY_LOSSES,
    PolicyLoss,
    PolicyLossOutput,
    PolicyLossParams,
    compute_policy_loss,
    get_policy_loss,
    register_policy_loss,
)

# The other objectives register themselves in POLICY_LOSSES on import (one file each).
from dapo.core import cispo, covariance_losses, gmpo, gspo, sapo  # noqa: E402,F401  isort: skip
from dapo.core.rollout_correction import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_MODES,
    ImportanceWeights,
    RejectionMask,
    rejection_mask,
    truncated_importance_weights,
)

__all__ = [
    "ADV_ESTIMATORS",
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_RS_MODES",
    "GroupFilterResult",
    "ImportanceWeights",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "AdvantageEstimator",
    "POLICY_LOSSES",
    "PolicyLoss",
    "PolicyLossOutput",
    "PolicyLossParams",
    "RejectionMask",
    "aggregate_loss",
    "broadcast_advantage",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_soft_overlong_penalty",
    "count_loss_normalizers",
    "entropy_from_logits",
    "filter_informative_groups",
    "get_adv_estimator",
    "get_policy_loss",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "overlong_filter_mask",
    "register_adv_estimator",
    "register_policy_loss",
    "rejection_mask",
    "truncated_importance_weights",
]
