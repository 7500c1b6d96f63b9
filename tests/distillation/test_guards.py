"""Guards against a distillation that silently does nothing (NousResearch/atropos#456): a teacher that is not the
student moves the loss and the weights, the student as its own teacher gives exactly zero signal, and a teacher
answer that is empty or of the wrong length stops the step naming the teacher."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dapo.distillation.teachers import TeacherSet
from dapo.training.errors import TrainingError
from tests.distillation.helpers import STUDENT, actor_step, distill_overrides, perturbed_teacher

REWARD_OFF = "distillation.distillation_loss.use_task_rewards=false"


def _largest_change(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_a_teacher_that_is_not_the_student_moves_the_loss_and_the_weights(tmp_path: Path) -> None:
    # Every sample right: the task reward's advantage is 0 everywhere, so only the teacher can move anything.
    teacher = perturbed_teacher(tmp_path / "teacher")
    moved, metrics, before = actor_step(distill_overrides(teacher, REWARD_OFF), same_rewards=True)
    still, self_metrics, _ = actor_step(distill_overrides(STUDENT, REWARD_OFF), same_rewards=True)
    assert metrics["distill/reverse_kl"] != 0.0 and metrics["actor/pg_loss"] != 0.0
    assert metrics["actor/grad_norm"] > 0.0
    # the student as teacher moves the weights by AdamW's weight decay only; the other teacher far more
    assert _largest_change(moved, before) > 10 * _largest_change(still, before)
    # and the reward alone (distillation off) on the same all-right groups trains nothing either
    plain, plain_metrics, _ = actor_step([], same_rewards=True)
    assert plain_metrics["actor/grad_norm"] == 0.0
    assert _largest_change(moved, plain) > 10 * _largest_change(plain, before)


@pytest.mark.parametrize(
    "mode",
    [
        ["distillation.distillation_loss.loss_mode=k1"],
        ["distillation.distillation_loss.loss_mode=k3", "distillation.distillation_loss.use_policy_gradient=false"],
    ],
)
def test_the_student_as_its_own_teacher_gives_exactly_zero_signal(mode: list[str]) -> None:
    _, metrics, _ = actor_step(distill_overrides(STUDENT, REWARD_OFF, *mode), same_rewards=True)
    assert metrics["distill/reverse_kl"] == 0.0
    assert metrics["distill/teacher_log_prob_mean"] == metrics["distill/student_log_prob_mean"]
    assert metrics["actor/grad_norm"] == 0.0  # not close to zero: exactly, so the loss had no teacher term left


class _BrokenTeacher:
    def __init__(self, answer: str) -> None:
        self.name, self.answer = "broken_teacher", answer

    def log_probs(self, batch):
        if self.answer == "nothing":
            return []
        return [torch.zeros(int(r.numel()) - 1) for r in batch.response_ids]  # one short each

    def identity(self) -> str:
        return "broken"

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("answer", "says"), [("nothing", "returned no log-probs"), ("short", r"returned \d+ log-probs for response 0")]
)
def test_a_teacher_answer_that_is_empty_or_short_stops_the_step_naming_the_teacher(answer: str, says: str) -> None:
    teachers = TeacherSet({"broken_teacher": _BrokenTeacher(answer)}, {"broken_teacher": None}, "data_source")
    with pytest.raises(TrainingError, match=f"distillation teacher 'broken_teacher' {says}"):
        actor_step(distill_overrides(STUDENT), teachers=teachers)
