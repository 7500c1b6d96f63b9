"""A teacher served over HTTP on loopback by dapo serve's OpenAI server (uvicorn, the HF backend): its
``prompt_logprobs`` are the local teacher's log-probs of exactly the student's tokens, and a server that does not
answer them, or tokenizes otherwise, is refused naming the teacher."""

from __future__ import annotations

import pytest
import torch

from dapo.actor.batch import TrainBatch
from dapo.config import ActorConfig
from dapo.distillation.local_teacher import LocalTeacher
from dapo.distillation.served_teacher import ServedTeacher
from dapo.distillation.teacher import TeacherError
from dapo.distillation.vocabulary import check_same_vocabulary
from dapo.model.loading import load_policy
from dapo.config import ModelConfig
from dapo.serve.config import ServeConfig
from dapo.serve.server import OpenAIServer
from tests.distillation.helpers import STUDENT, actor_step, distill_overrides
from tests.serve.serve_helpers import uvicorn_app


@pytest.fixture(scope="module")
def served_port():
    with uvicorn_app(OpenAIServer(ServeConfig(device="cpu", backend="hf"))) as port:
        yield port


def _batch(tokenizer) -> TrainBatch:
    prompts = [tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]] * 2
    responses = [
        tokenizer(" 5. The answer is 5", add_special_tokens=False)["input_ids"],
        tokenizer(" 6", add_special_tokens=False)["input_ids"],
    ]
    return TrainBatch(
        prompt_ids=prompts,
        response_ids=responses,
        advantages=torch.zeros(2),
        sample_mask=torch.ones(2, dtype=torch.bool),
        group_index=torch.zeros(2, dtype=torch.long),
    )


def test_the_served_teacher_scores_exactly_the_student_tokens_as_the_local_one(served_port: int) -> None:
    student = load_policy(ModelConfig())
    served = ServedTeacher(
        "served",
        f"http://127.0.0.1:{served_port}",
        served_model_name=None,
        timeout_s=60,
        student_tokenizer=student.tokenizer,
    )
    local = LocalTeacher("local", STUDENT, actor_cfg=ActorConfig(), device="cpu", student_tokenizer=student.tokenizer)
    batch = _batch(student.tokenizer)
    got, want = served.log_probs(batch), local.log_probs(batch)
    assert [g.numel() for g in got] == batch.response_lengths
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)
    assert "served http://127.0.0.1" in served.identity()


def test_a_training_step_with_the_served_student_as_teacher_has_no_signal(served_port: int) -> None:
    _, metrics, _ = actor_step(
        distill_overrides(f"http://127.0.0.1:{served_port}/v1", "distillation.distillation_loss.use_task_rewards=false")
    )
    assert abs(metrics["distill/reverse_kl"]) < 1e-4  # the same weights over HTTP: float noise only
    assert metrics["distill/teacher_log_prob_mean"] < 0.0


def test_an_unreachable_server_is_refused_naming_the_teacher() -> None:
    from tests.harness.ports import free_port

    with pytest.raises(TeacherError, match="distillation teacher 'far' at http://127.0.0.1:.*cannot reach it"):
        ServedTeacher(
            "far",
            f"http://127.0.0.1:{free_port()}",
            served_model_name="x",
            timeout_s=5,
            student_tokenizer=load_policy(ModelConfig()).tokenizer,
        )


class _OtherTokenizer:
    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "b": 1}


def test_a_teacher_with_another_vocabulary_is_refused_naming_it() -> None:
    with pytest.raises(TeacherError, match="distillation teacher 'big' has another vocabulary than the student"):
        check_same_vocabulary("big", _OtherTokenizer(), load_policy(ModelConfig()).tokenizer)
