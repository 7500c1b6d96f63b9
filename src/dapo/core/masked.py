"""Masked reductions over the valid (response) tokens of a padded ``[B, T]`` batch.

Padded positions may hold any finite value; they are selected away with ``torch.where`` (not multiplied by the mask)
so that a large or infinite pad value can never leak into a sum. A mask is read as boolean: nonzero means valid.
"""

import torch
from torch import Tensor


def check_same_shape(where: str, **tensors: Tensor) -> None:
    """Raise ``ValueError`` naming ``where`` and every shape when the given tensors do not all share one shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name}={shape}" for name, shape in shapes.items())
        raise ValueError(f"{where}: tensors must have the same shape, got {listed}")


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is nonzero (over ``dim``, or over everything when ``dim`` is None)."""
    check_same_shape("masked_sum", values=values, mask=mask)
    selected = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return selected.sum() if dim is None else selected.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the valid positions; 0 (not NaN) where there is no valid position."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)
