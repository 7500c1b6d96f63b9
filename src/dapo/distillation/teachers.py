"""The configured teachers of a run (``distillation.teacher_models``), and which one scores which sample.

One teacher scores every sample. Several are routed by ``distillation.teacher_key``: a sample goes to the teacher
whose ``key`` equals the sample's ``data_source`` (the default key) or the value of that name in its prompt's
``extra_info``; a sample no teacher claims stops the run, naming the value and the keys there are (verl does the same).
Every answer passes :func:`dapo.distillation.teacher.checked_log_probs` before it becomes a signal.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from dapo.actor.batch import TrainBatch
from dapo.config import DapoConfig
from dapo.config.schema import is_served_teacher
from dapo.distillation.local_teacher import LocalTeacher
from dapo.distillation.served_teacher import ServedTeacher
from dapo.distillation.teacher import Teacher, TeacherError, checked_log_probs

__all__ = ["TeacherSet", "build_teachers"]


class TeacherSet:
    """``teachers`` by name with their routing keys (None: a single teacher takes everything)."""

    def __init__(self, teachers: dict[str, Teacher], keys: dict[str, str | None], teacher_key: str) -> None:
        self.teachers = teachers
        self.keys = keys
        self.teacher_key = teacher_key

    def names_for(self, routes: Sequence[str | None]) -> list[str]:
        """The teacher of each sample, from its routing value."""
        if len(self.teachers) == 1:
            return [next(iter(self.teachers))] * len(routes)
        by_key = {key: name for name, key in self.keys.items()}
        out = []
        for value in routes:
            if value not in by_key:
                raise TeacherError(
                    f"a sample's {self.teacher_key}={value!r} names no distillation teacher; the "
                    f"teachers' keys are {sorted(k for k in by_key if k is not None)}"
                )
            out.append(by_key[value])
        return out

    def _per_teacher(self, batch: TrainBatch, routes: Sequence[str | None]) -> dict[str, list[int]]:
        if len(routes) != len(batch):
            raise ValueError(f"{len(routes)} routing values for {len(batch)} samples")
        owners: dict[str, list[int]] = {}
        for i, name in enumerate(self.names_for(routes)):
            owners.setdefault(name, []).append(i)
        return owners

    def log_probs(self, batch: TrainBatch, routes: Sequence[str | None]) -> list[Tensor]:
        """Per response, the log-probs of its tokens under its teacher, checked (length, finiteness, presence)."""
        out: list[Tensor | None] = [None] * len(batch)
        for name, indices in self._per_teacher(batch, routes).items():
            part = batch if len(indices) == len(batch) else batch.select(indices)  # whole groups: one route each
            scores = checked_log_probs(name, part, self.teachers[name].log_probs(part))
            for i, score in zip(indices, scores, strict=True):
                out[i] = score
        return [t for t in out if t is not None]

    def top_log_probs(
        self, batch: TrainBatch, routes: Sequence[str | None], k: int
    ) -> tuple[list[Tensor], list[Tensor]]:
        values: list[Tensor | None] = [None] * len(batch)
        ids: list[Tensor | None] = [None] * len(batch)
        for name, indices in self._per_teacher(batch, routes).items():
            part = batch if len(indices) == len(batch) else batch.select(indices)
            got_values, got_ids = self.teachers[name].top_log_probs(part, k)
            if len(got_values) != len(part) or any(
                v.shape[0] != int(r.numel()) for v, r in zip(got_values, part.response_ids)
            ):
                raise TeacherError(
                    f"distillation teacher '{name}' returned top-k log-probs that do not cover the student's responses"
                )
            for i, v, t in zip(indices, got_values, got_ids, strict=True):
                values[i], ids[i] = v.float().cpu(), t.long().cpu()
        return [v for v in values if v is not None], [t for t in ids if t is not None]

    def identity(self) -> dict[str, str]:
        """Each teacher's identity (resume check): name -> what it is."""
        return {name: teacher.identity() for name, teacher in self.teachers.items()}

    def local(self) -> dict[str, LocalTeacher]:
        return {n: t for n, t in self.teachers.items() if isinstance(t, LocalTeacher)}

    def close(self) -> None:
        for teacher in self.teachers.values():
            teacher.close()


def build_teachers(cfg: DapoConfig, *, device: torch.device | str, student_tokenizer: object) -> TeacherSet | None:
    """The teachers ``cfg.distillation`` names (None when distillation is off), each loaded or reached once and
    checked to share the student's tokenizer."""
    ds = cfg.distillation
    if not ds.enabled:
        return None
    teachers: dict[str, Teacher] = {}
    try:
        for name, t in ds.teacher_models.items():
            if is_served_teacher(t.model_path):
                teachers[name] = ServedTeacher(
                    name,
                    t.model_path,
                    served_model_name=t.served_model_name,
                    timeout_s=t.timeout_s,
                    student_tokenizer=student_tokenizer,
                )
            else:
                teachers[name] = LocalTeacher(
                    name, t.model_path, actor_cfg=cfg.actor, device=device, student_tokenizer=student_tokenizer
                )
    except BaseException:
        for teacher in teachers.values():
            teacher.close()
        raise
    return TeacherSet(teachers, {n: t.key for n, t in ds.teacher_models.items()}, ds.teacher_key)
