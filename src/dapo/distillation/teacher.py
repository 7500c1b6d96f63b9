"""What a distillation teacher answers, and the guards that stop a run when its answer cannot be the signal.

A teacher gets a :class:`~dapo.actor.batch.TrainBatch` (the student's prompts and sampled responses) and returns, per
response, the log-prob of each sampled token under the teacher at temperature 1. An answer that is missing, has the
wrong number of entries, the wrong length for a response or a non-finite value stops the run with
:class:`TeacherError` naming the teacher: a teacher whose data is silently dropped turns distillation into a no-op
(NousResearch/atropos#456: weeks of runs that learned nothing from their teacher).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from dapo.actor.batch import TrainBatch

__all__ = ["Teacher", "TeacherError", "checked_log_probs"]


class TeacherError(RuntimeError):
    """A teacher cannot be used or gave an unusable answer; the message names the teacher."""


class Teacher(Protocol):
    name: str

    def log_probs(self, batch: TrainBatch) -> list[Tensor]:
        """Per response, ``[len]`` fp32 log-probs of its tokens under the teacher (temperature 1)."""
        ...

    def top_log_probs(self, batch: TrainBatch, k: int) -> tuple[list[Tensor], list[Tensor]]:
        """Per response, ``[len, k]`` log-probs of the teacher's k most likely tokens at each position, and their
        ids."""
        ...

    def identity(self) -> str:
        """What this teacher is, for the resume check: the same string for the same weights."""
        ...

    def close(self) -> None: ...


def checked_log_probs(name: str, batch: TrainBatch, answer: object) -> list[Tensor]:
    """``answer`` as per-response fp32 CPU tensors, or :class:`TeacherError` naming teacher ``name`` and what is
    wrong (nothing returned, a count or a length that differs from the batch's, a non-finite or positive value)."""
    where = f"distillation teacher '{name}'"
    if answer is None or (isinstance(answer, (list, tuple)) and len(answer) == 0 and len(batch) > 0):
        raise TeacherError(
            f"{where} returned no log-probs for a batch of {len(batch)} responses; distillation "
            "without the teacher's signal would train nothing from it"
        )
    if not isinstance(answer, (list, tuple)) or len(answer) != len(batch):
        got = len(answer) if isinstance(answer, (list, tuple)) else type(answer).__name__
        raise TeacherError(f"{where} returned log-probs for {got} responses; the batch has {len(batch)}")
    out = []
    for i, (values, response) in enumerate(zip(answer, batch.response_ids, strict=True)):
        tensor = torch.as_tensor(values, dtype=torch.float32).detach().cpu().reshape(-1)
        if tensor.numel() != response.numel():
            raise TeacherError(
                f"{where} returned {tensor.numel()} log-probs for response {i}, which has "
                f"{response.numel()} tokens: it must score exactly the student's tokens"
            )
        if not bool(torch.isfinite(tensor).all()) or bool((tensor > 1e-4).any()):
            raise TeacherError(
                f"{where} returned an invalid log-prob for response {i} (non-finite or > 0: "
                f"{tensor[~torch.isfinite(tensor) | (tensor > 1e-4)][:3].tolist()})"
            )
        out.append(tensor.clamp(max=0.0))
    return out
