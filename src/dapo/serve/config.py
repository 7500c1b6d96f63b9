"""What one served model is and the bounds every request is held to."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo.rollout.factory import ENGINE_NAMES

BACKENDS: tuple[str, ...] = ("auto", *ENGINE_NAMES)  # the registry's engines, or the default for the device


class ServeConfigError(ValueError):
    """A serve setting is wrong; the message names it."""


@dataclass(frozen=True)
class ServeConfig:
    """Settings of ``dapo serve`` / ``dapo.serve:build_app`` (``serve run dapo.serve:build_app model=... key=value``).

    Attributes:
        model: Hugging Face model folder; None = the embedded tiny Qwen2.
        served_model_name: the ``model`` clients send; default the folder's name (``tiny-qwen2`` for the embedded one),
            as the published server does. The model path itself is accepted too.
        backend: ``hf`` (the project's engine), ``vllm``, or ``auto`` (vLLM on a GPU when installed, else HF).
        tensor_parallel_size: vLLM tensor-parallel ranks per replica.
        num_replicas: replicas; None = GPUs // tensor_parallel_size on a GPU cluster, else 1.
        device: ``auto``, ``cpu`` or ``cuda`` (HF backend).
        max_model_len: prompt + response tokens at most; None = the model's ``max_position_embeddings``.
        max_tokens_limit: largest ``max_tokens`` accepted.
        default_max_tokens: ``max_tokens`` when a request gives none (bounded by what the prompt leaves).
        max_n: largest ``n``.
        max_body_bytes: largest request body; larger ones get 413.
        max_batch_rows: sequences decoded together at most (requests queue beyond it).
        batch_wait_ms: how long a batch waits for more requests to join once the engine is free.
        max_ongoing_requests: Ray Serve's per-replica bound (the published server: 256).
        num_cpus: CPUs reserved by a replica; num_threads: torch threads in a replica (None = all cores).
    """

    model: str | None = None
    served_model_name: str | None = None
    backend: str = "auto"
    tensor_parallel_size: int = 1
    num_replicas: int | None = None
    device: str = "auto"
    max_model_len: int | None = None
    max_tokens_limit: int = 32768
    default_max_tokens: int = 1024
    max_n: int = 64
    max_body_bytes: int = 4 * 1024 * 1024
    max_batch_rows: int = 256
    batch_wait_ms: float = 5.0
    max_ongoing_requests: int = 256
    num_cpus: float = 1.0
    num_threads: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ServeConfigError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ServeConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        for name in ("tensor_parallel_size", "max_tokens_limit", "default_max_tokens", "max_n", "max_body_bytes",
                     "max_batch_rows", "max_ongoing_requests"):
            if getattr(self, name) < 1:
                raise ServeConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_replicas is not None and self.num_replicas < 1:
            raise ServeConfigError(f"num_replicas must be >= 1, got {self.num_replicas}")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return Path(self.model.rstrip("/")).name if self.model else "tiny-qwen2"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ServeConfig:
        """From ``serve run`` arguments (strings; ``tensor-parallel-size`` and ``tensor_parallel_size`` both work)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for raw_key, raw in (args or {}).items():
            key = str(raw_key).replace("-", "_")
            if key == "model_path":
                key = "model"
            if key not in fields:
                raise ServeConfigError(f"unknown serve argument {raw_key!r}; known: {sorted(fields)}")
            values[key] = _convert(key, fields[key].type, raw)
        return cls(**values)


def _convert(key: str, annotation: Any, raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    kind = str(annotation)
    if text.lower() in ("none", "null", "") and "None" in kind:
        return None
    try:
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
    except ValueError:
        raise ServeConfigError(f"serve argument {key}: expected a number, got {raw!r}") from None
    return text
