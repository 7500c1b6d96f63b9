"""Rule-based rewards: the DAPO math scorer, GSM8K, symbolic equivalence, a registry and batch scoring.

Entry points: ``compute_score`` (DAPO's +1/-1 rule), ``get_scorer`` / ``register_scorer`` / ``score_one``
(pick a scorer by data_source), ``score_batch`` (many responses, optionally in a hang-proof pool).
"""

from dapo.reward.batch import RewardScoringError, RewardWorkerPool, score_batch
from dapo.reward.custom_fn import load_custom_reward_fn
from dapo.reward.gsm8k import gsm8k_score
from dapo.reward.math_dapo import compute_score, math_dapo_scorer
from dapo.reward.math_verify_scorer import SymbolicMathScorer
from dapo.reward.normalize import normalize_final_answer
from dapo.reward.records import RewardInput, RewardResult
from dapo.reward.registry import (
    ScorerRegistry,
    UnknownDataSourceError,
    builtin_registry,
    get_scorer,
    register_scorer,
    score_one,
)
from dapo.reward.symbolic import SymbolicVerifier, math_verify_available

__all__ = [
    "RewardInput",
    "RewardResult",
    "RewardScoringError",
    "RewardWorkerPool",
    "ScorerRegistry",
    "SymbolicMathScorer",
    "SymbolicVerifier",
    "UnknownDataSourceError",
    "builtin_registry",
    "compute_score",
    "get_scorer",
    "gsm8k_score",
    "load_custom_reward_fn",
    "math_dapo_scorer",
    "math_verify_available",
    "normalize_final_answer",
    "register_scorer",
    "score_batch",
    "score_one",
]
