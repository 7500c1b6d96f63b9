"""Numeric precision of the actor's forward passes.

``dtype == "bf16"`` runs the forward under bf16 autocast while the parameters (and so the optimizer's master weights)
stay in whatever dtype they were loaded in, normally fp32; ``"fp32"`` runs as is. Old log-probs and training log-probs
use the same context, so at the first step of an on-policy update the importance ratio is exactly 1.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["autocast_context"]


def autocast_context(dtype: str, device: torch.device) -> contextlib.AbstractContextManager[object]:
    """The context to run actor forwards in for the configured ``dtype`` ("fp32" or "bf16") on ``device``."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ValueError(f"actor.dtype must be 'fp32' or 'bf16', got {dtype!r}")
