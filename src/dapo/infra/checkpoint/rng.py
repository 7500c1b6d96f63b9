"""Capturing and restoring every RNG stream training draws from (python, numpy, torch CPU and CUDA), so a resumed run
draws the same numbers an uninterrupted one would: half of what makes resume bit-identical."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__package__)  # the package's one logger: its name is what filters and log lines show


def capture_rng_state() -> dict[str, Any]:
    """Every RNG stream training may draw from, in a form ``torch.load(weights_only=True)`` accepts."""
    state: dict[str, Any] = {"python": random.getstate(), "torch_cpu": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with pandas, a hard dependency
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        keys_tensor = torch.from_numpy(np.asarray(keys, dtype=np.int64))  # uint32 -> int64: a weights_only type
        state["numpy"] = (kind, keys_tensor, int(pos), int(has_gauss), float(cached))
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any], where: Path) -> None:
    random.setstate(_as_tuples(state["python"]))
    torch.set_rng_state(state["torch_cpu"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "torch_cuda" in state:
        if not torch.cuda.is_available():
            logger.warning("%s holds CUDA RNG states but CUDA is not available here; CUDA RNG not restored", where)
        elif len(state["torch_cuda"]) != torch.cuda.device_count():
            logger.warning(
                "%s holds CUDA RNG states for %d devices but %d are visible; CUDA RNG not restored",
                where,
                len(state["torch_cuda"]),
                torch.cuda.device_count(),
            )
        else:
            torch.cuda.set_rng_state_all(state["torch_cuda"])


def _as_tuples(value: Any) -> Any:
    """``random.setstate`` needs nested tuples; torch.load may hand back lists."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    return value
