"""The same-tokenizer requirement: a teacher scores the student's token ids, so both must mean the same text by each.

Cross-tokenizer distillation (aligning two vocabularies) is out of scope (docs/distillation.md); a teacher whose
vocabulary differs is refused before the first step, naming the teacher and the first difference.
"""

from __future__ import annotations

from collections.abc import Sequence

from dapo.distillation.teacher import TeacherError

__all__ = ["PROBE_TEXT", "check_same_ids", "check_same_vocabulary"]

PROBE_TEXT = "Distillation probe: 12 + 30 = 42, so the answer is 42."
"""Text both tokenizers must split into the same ids (a served teacher only shows its ids this way)."""


def check_same_vocabulary(name: str, teacher_tokenizer: object, student_tokenizer: object) -> None:
    """Raise :class:`TeacherError` unless the two tokenizers map every token to the same id."""
    teacher_vocab = teacher_tokenizer.get_vocab()  # type: ignore[attr-defined]
    student_vocab = student_tokenizer.get_vocab()  # type: ignore[attr-defined]
    if teacher_vocab == student_vocab:
        return
    differ = sorted(set(teacher_vocab.items()) ^ set(student_vocab.items()), key=lambda kv: kv[1])
    example = differ[0] if differ else ("?", -1)
    raise TeacherError(
        f"distillation teacher '{name}' has another vocabulary than the student ({len(teacher_vocab)} vs "
        f"{len(student_vocab)} tokens; e.g. token {example[0]!r} -> id {example[1]} in one only): the teacher must "
        "share the student's tokenizer (cross-tokenizer distillation is not supported, docs/distillation.md)"
    )


def check_same_ids(name: str, teacher_ids: Sequence[int], student_ids: Sequence[int]) -> None:
    """Raise :class:`TeacherError` when the teacher tokenized :data:`PROBE_TEXT` into other ids than the student."""
    if list(teacher_ids) != list(student_ids):
        raise TeacherError(
            f"distillation teacher '{name}' tokenizes the probe text {PROBE_TEXT!r} into other ids than the student "
            f"({list(teacher_ids)[:12]} vs {list(student_ids)[:12]}): the teacher must share the student's tokenizer "
            "(cross-tokenizer distillation is not supported, docs/distillation.md)"
        )
