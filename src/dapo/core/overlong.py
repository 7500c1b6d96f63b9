"""Overlong reward shaping (DAPO Section 3.4): a soft length penalty and the overlong filter.

Both are independent switches: the soft penalty (Eq. 13) is added to the rule-based reward; the filter removes
truncated samples from the loss so that a cut-off, possibly sound, reasoning chain is not punished as wrong.
"""

import torch
from torch import Tensor


def compute_soft_overlong_penalty(
    response_lengths: Tensor,
    *,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """Soft overlong punishment, DAPO Eq. 13, scaled by ``penalty_factor``.

    With ``L_max = max_response_length`` and ``L_cache = overlong_buffer_len``::

        R_length(y) = 0                                  if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                 if L_max < |y|

    so it falls linearly from 0 to -1 over the last ``L_cache`` tokens (exactly -1 at ``|y| = L_max``).

    Args:
        response_lengths: ``[B]`` integer number of generated tokens per response.
        max_response_length: ``L_max``.
        overlong_buffer_len: ``L_cache``, with ``0 < L_cache <= L_max``.
        penalty_factor: scale of the penalty (>= 0); -penalty_factor is the worst value.

    Returns:
        ``[B]`` float32 penalties in ``[-penalty_factor, 0]``.
    """
    if not 0 < overlong_buffer_len <= max_response_length:
        raise ValueError(
            "compute_soft_overlong_penalty: need 0 < overlong_buffer_len (L_cache) <= max_response_length (L_max), "
            f"got overlong_buffer_len={overlong_buffer_len}, max_response_length={max_response_length}"
        )
    if penalty_factor < 0:
        raise ValueError(f"compute_soft_overlong_penalty: penalty_factor must be >= 0, got {penalty_factor}")
    if response_lengths.dim() != 1 or response_lengths.is_floating_point() or response_lengths.dtype == torch.bool:
        raise ValueError(
            "compute_soft_overlong_penalty: response_lengths must be a 1-D integer tensor, "
            f"got shape {tuple(response_lengths.shape)} dtype {response_lengths.dtype}"
        )
    if bool((response_lengths < 0).any()):
        raise ValueError(
            f"compute_soft_overlong_penalty: response_lengths must be >= 0, got {response_lengths.tolist()}"
        )

    expected_length = max_response_length - overlong_buffer_len
    excess = (response_lengths - expected_length).to(torch.float32)
    penalty = (-excess / overlong_buffer_len).clamp(min=-1.0, max=0.0)
    return penalty * penalty_factor


def overlong_filter_mask(truncated: Tensor) -> Tensor:
    """Overlong filtering: ``[B]`` bool, True = keep the sample in the loss, False = it was truncated at ``L_max``."""
    if truncated.dim() != 1 or truncated.dtype != torch.bool:
        raise ValueError(
            f"overlong_filter_mask: truncated must be a 1-D bool tensor, got shape {tuple(truncated.shape)} "
            f"dtype {truncated.dtype}"
        )
    return ~truncated
