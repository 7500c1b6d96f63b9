"""What one served model is and the bounds every request is held to."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dapo.infra.device import DEVICE_CHOICES
from dapo.infra.model_name import model_name
from dapo.rollout.factory import AUTO_ENGINE, ENGINE_NAMES

BACKENDS: tuple[str, ...] = (AUTO_ENGINE, *ENGINE_NAMES)  # the registry's engines, or the default for the device


class ServeConfigError(ValueError):
    """A serve setting is wrong; the message names it."""


@dataclass(frozen=True)
class ServeConfig:
    """Settings of ``dapo serve`` / ``dapo.serve:build_app`` (``serve run dapo.serve:build_app model=... key=value``).

    Attributes:
        model: Hugging Face model folder; None = the embedded tiny Qwen2.
        served_model_name: the ``model`` clients send; default the folder's name (``tiny-qwen2`` for the embedded one),
            as the published server does, and ``<run>-global_step_N`` for a checkpoint's ``hf`` folder. The model path
            itself is accepted too.
        backend: ``hf`` (the project's engine), ``vllm``, or ``auto`` (vLLM on a GPU when installed, else HF).
        tensor_parallel_size: vLLM tensor-parallel ranks per replica.
        num_replicas: replicas; None = GPUs // tensor_parallel_size on a GPU cluster, else 1.
        device: ``auto``, ``cpu`` or ``cuda`` (HF backend).
        max_model_len: prompt + response tokens at most; None = the model's ``max_position_embeddings``.
        max_tokens_limit: largest ``max_tokens`` accepted.
        default_max_tokens: ``max_tokens`` when a request gives none (bounded by what the prompt leaves).
        max_n: largest ``n``.
        header_timeout_s: a request's headers must arrive whole within this many seconds of the connection opening
            (or of its next request's first byte): 408 and the connection is closed (a connection that sent nothing
            is closed without an answer). ``dapo serve``'s front door only.
        keep_alive_timeout_s: an idle keep-alive connection is closed after this many seconds without a request.
            ``dapo serve``'s front door only.
        max_body_bytes: largest request body; larger ones get 413.
        body_timeout_s: a request body must arrive whole within this many seconds of its headers (408 otherwise): a
            client that sends headers and part of a body cannot hold a slot for long.
        body_grace_s: a body that arrives whole within this many seconds of its headers never takes an upload slot
            (it cannot be dropped by ``max_unfinished_uploads``): a well-behaved client's body may trail its headers
            (a separate TCP segment, a loaded machine; Ray Serve's proxy forwarded it hundreds of ms late).
        max_unfinished_uploads: requests whose body is still arriving after ``body_grace_s``, at most (``dapo serve``:
            in its front door; ``serve run``: per replica); when one more arrives, the oldest of them is answered 503
            and dropped, so stalled uploads never crowd out a newer client (slow-loris), and under ``serve run`` never
            take every one of the replica's ``max_ongoing_requests`` slots.
        shutdown_drain_s: on SIGINT or SIGTERM the front door stops listening and lets the requests in flight finish
            for up to this many seconds (new requests on open connections get 503), then cuts the rest. ``dapo
            serve``'s front door only.
        max_sequences_per_request: prompts x ``n`` of one request, at most (400 beyond).
        max_batch_rows: sequences decoded together at most (requests queue beyond it).
        max_batch_rows_per_request: sequences of one request in one engine call, at most (None = max_batch_rows // 4):
            a larger request is decoded over several calls, round-robin with the others (fair scheduling).
        decode_chunk_tokens: tokens decoded per engine call at most before the batch is re-formed (requests join and
            leave, cancelled requests are dropped); larger = less re-prefill work. With the Transformers backend each
            token streams the step it is drawn and an arrival ends a call after the step under way, so this bounds
            neither the stream's granularity nor a newcomer's wait; with vLLM's, both are a call.
        batch_wait_ms: how long a batch waits for more requests to join once the engine is free.
        max_ongoing_requests: Ray Serve's per-replica bound on requests in flight (the published server: 256; here
            1024 by default, so that under ``serve run`` requests refused or timed out by the upload bounds are
            refused inside the replica at once instead of queueing at the proxy ahead of well-behaved ones; decoding
            work is bounded by ``max_batch_rows``, not by this).
        num_cpus: CPUs reserved by a replica; num_threads: torch threads in a replica (None = all cores).
        loopback_only: the local Ray runtime is loopback-only, so the replica binds its own gRPC port to 127.0.0.1
            too (False when joining a cluster with ``--ray-address``).
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
    header_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 15.0
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 10.0
    body_grace_s: float = 1.0
    max_unfinished_uploads: int = 64
    shutdown_drain_s: float = 30.0
    max_sequences_per_request: int = 256
    max_batch_rows: int = 256
    max_batch_rows_per_request: int | None = None
    decode_chunk_tokens: int = 16
    batch_wait_ms: float = 5.0
    max_ongoing_requests: int = 1024
    num_cpus: float = 1.0
    num_threads: int | None = None
    seed: int = 0
    loopback_only: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ServeConfigError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.device not in DEVICE_CHOICES:
            raise ServeConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        for name in (
            "tensor_parallel_size",
            "max_tokens_limit",
            "default_max_tokens",
            "max_n",
            "max_body_bytes",
            "max_batch_rows",
            "max_ongoing_requests",
            "max_unfinished_uploads",
            "decode_chunk_tokens",
            "max_sequences_per_request",
        ):
            if getattr(self, name) < 1:
                raise ServeConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout_s", "keep_alive_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ServeConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.shutdown_drain_s < float("inf"):
            raise ServeConfigError(f"shutdown_drain_s must be >= 0 and finite, got {self.shutdown_drain_s}")
        if not 0 <= self.body_grace_s < self.body_timeout_s:
            raise ServeConfigError(
                f"body_grace_s must be >= 0 and below body_timeout_s ({self.body_timeout_s:g}), got {self.body_grace_s}"
            )
        if self.max_unfinished_uploads >= self.max_ongoing_requests:
            raise ServeConfigError(
                f"max_unfinished_uploads ({self.max_unfinished_uploads}) must be below "
                f"max_ongoing_requests ({self.max_ongoing_requests}), or stalled uploads can take "
                "every slot"
            )
        if self.num_replicas is not None and self.num_replicas < 1:
            raise ServeConfigError(f"num_replicas must be >= 1, got {self.num_replicas}")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return model_name(self.model)  # a checkpoint's hf/ folder is served as <run>-global_step_N, not "hf"

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
    if kind.startswith("bool"):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ServeConfigError(f"serve argument {key}: expected true or false, got {raw!r}")
    try:
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
    except ValueError:
        raise ServeConfigError(f"serve argument {key}: expected a number, got {raw!r}") from None
    return text
