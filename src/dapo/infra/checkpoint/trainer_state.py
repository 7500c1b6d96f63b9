"""Splitting the trainer's opaque resume state into what JSON holds exactly (``trainer_state.json``, readable by a
person) and the rest (``trainer_state.pt``), so that loading gives back a dict equal to the one saved."""

from __future__ import annotations

import json
from typing import Any


def split_trainer_state(trainer_state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the trainer state into a JSON-exact part and a torch.save part (by top-level key)."""
    if not isinstance(trainer_state, dict):
        raise TypeError(f"save_checkpoint: trainer_state must be a dict, got {type(trainer_state).__name__}")
    json_part: dict[str, Any] = {}
    tensor_part: dict[str, Any] = {}
    for key, value in trainer_state.items():
        if not isinstance(key, str):
            raise TypeError(f"save_checkpoint: trainer_state keys must be str, got {key!r} ({type(key).__name__})")
        (json_part if _json_round_trips(value) else tensor_part)[key] = value
    return json_part, tensor_part


def _json_round_trips(value: Any) -> bool:
    """True when ``json.loads(json.dumps(value)) == value`` with the same types (strict, no NaN)."""
    try:
        restored = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return False
    return _same_json_value(value, restored)


def _same_json_value(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
