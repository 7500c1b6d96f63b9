"""A teacher in the trainer's process: a Hugging Face model folder, loaded once, run forward only.

Its log-probs come from the actor's own helper (``dapo.actor.log_probs``), with the actor's micro-batching and
dtype, so a teacher with the student's weights gives exactly the student's log-probs (the guard test of a zero
signal). Its weights never take a gradient and are never saved with the run.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import Tensor

from dapo.actor.batch import TrainBatch
from dapo.actor.log_probs import compute_log_probs_batch, compute_top_log_probs_batch
from dapo.config import ActorConfig, ModelConfig
from dapo.distillation.teacher import TeacherError
from dapo.distillation.vocabulary import check_same_vocabulary
from dapo.model.loading import ModelLoadError, Policy, load_policy, resolve_model_path

__all__ = ["LocalTeacher", "folder_fingerprint"]

_FINGERPRINT_BYTES = 1 << 20  # of each weight file's head and tail: header and first/last tensors change with training


def folder_fingerprint(folder: Path) -> str:
    """sha256 over a model folder's config.json and, for each weight file, its name, size, first and last MiB:
    another training run's weights differ there, and a 70 GB folder is not read whole."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.name == "config.json" or path.suffix in (".safetensors", ".bin", ".pt", ".gguf"):
            size = path.stat().st_size
            digest.update(f"{path.name}:{size}:".encode())
            with path.open("rb") as f:
                digest.update(f.read(_FINGERPRINT_BYTES))
                if size > 2 * _FINGERPRINT_BYTES:
                    f.seek(size - _FINGERPRINT_BYTES)
                    digest.update(f.read())
    return digest.hexdigest()[:16]


class LocalTeacher:
    """Teacher ``name`` loaded from ``model_path`` onto ``device``; scored like the actor (``actor_cfg``)."""

    def __init__(
        self,
        name: str,
        model_path: str,
        *,
        actor_cfg: ActorConfig,
        device: torch.device | str,
        student_tokenizer: object,
    ) -> None:
        self.name = name
        self.actor_cfg = actor_cfg
        model_cfg = ModelConfig(path=model_path)
        try:
            self.folder = resolve_model_path(model_cfg)
            self.policy: Policy = load_policy(model_cfg, device=device)
        except (ModelLoadError, OSError, ValueError) as exc:
            raise TeacherError(f"distillation teacher '{name}' ({model_path}): {exc}") from None
        check_same_vocabulary(name, self.policy.tokenizer, student_tokenizer)
        self.model = self.policy.model
        self.model.eval()
        self.model.requires_grad_(False)
        self._identity = f"local {self.folder.resolve()} sha256:{folder_fingerprint(self.folder)}"

    def log_probs(self, batch: TrainBatch) -> list[Tensor]:
        return compute_log_probs_batch(self.model, batch, self.actor_cfg, temperature=1.0)

    def top_log_probs(self, batch: TrainBatch, k: int) -> tuple[list[Tensor], list[Tensor]]:
        return compute_top_log_probs_batch(self.model, batch, self.actor_cfg, k)

    def identity(self) -> str:
        return self._identity

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
