"""The actor's optimizer (AdamW) and learning-rate schedule (linear warm-up, then constant; the DAPO recipe's).

Weight decay is applied to matrices only (parameters with 2 or more dimensions: linear weights and embeddings), not to
vectors (biases, RMSNorm/LayerNorm gains): decaying a gain towards 0 shrinks the activations instead of regularising,
and biases carry no scale to regularise. This is the nanoGPT / Hugging Face Trainer convention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

if TYPE_CHECKING:
    from dapo.config import OptimConfig

__all__ = ["LinearWarmupThenConstant", "build_lr_scheduler", "build_optimizer", "parameter_groups"]


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """Two AdamW groups of the trainable parameters: matrices with ``weight_decay``, vectors/scalars without."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    if not decay and not no_decay:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, optim_cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``model`` with ``optim_cfg``'s lr, betas, eps and weight decay."""
    return torch.optim.AdamW(
        parameter_groups(model, optim_cfg.weight_decay),
        lr=optim_cfg.lr,
        betas=tuple(optim_cfg.betas),
        eps=optim_cfg.eps,
    )


@dataclass(frozen=True)
class LinearWarmupThenConstant:
    """LR multiplier for optimizer step ``k`` (0-based): ``min(1, (k + 1) / warmup_steps)``; 1 without warm-up.

    The first step already uses ``lr / warmup_steps`` (not 0, which would waste a step), and step ``warmup_steps - 1``
    reaches the full ``lr``. A dataclass rather than a lambda so the scheduler's ``state_dict`` can save it.
    """

    warmup_steps: int

    def __call__(self, step: int) -> float:
        if self.warmup_steps <= 0:
            return 1.0
        return min(1.0, (step + 1) / self.warmup_steps)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: OptimConfig) -> LambdaLR:
    """Linear warm-up over ``optim_cfg.lr_warmup_steps`` optimizer steps, then the constant ``optim_cfg.lr``.

    Call ``scheduler.step()`` once after every ``optimizer.step()``.
    """
    if optim_cfg.lr_warmup_steps < 0:
        raise ValueError(f"optim.lr_warmup_steps must be >= 0, got {optim_cfg.lr_warmup_steps}")
    return LambdaLR(optimizer, LinearWarmupThenConstant(optim_cfg.lr_warmup_steps))
