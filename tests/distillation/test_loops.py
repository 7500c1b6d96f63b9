"""Distillation through whole `dapo train` runs (2 steps of the tiny model, a perturbed copy as teacher) under each
setting the single actor-step tests do not reach: the async loops (``one_step_off``, ``fully_async``: pi_old is the
recomputed student, the samples come from a rollout worker), LoRA (PG OPD and a direct mode), and multi-turn tool
rollouts (configs/tools/tiny_calculator.yaml), where the teacher reads tool output but only the model's own tokens
carry its signal, from a local teacher or one served over loopback HTTP.

What each run must show, step by step: the teacher's signal is there (``distill/reverse_kl`` logged, finite, non-zero
for a teacher that is not the student) and reaches the loss: with the task reward off the teacher's signal is the whole
advantage, so a non-zero policy-gradient loss and gradient come from it alone (the atropos#456 no-op would leave
both at 0).

Runs are in this process (``train``); the async modes spawn their rollout worker as any `dapo train` does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dapo.config import load_config
from dapo.distillation.teachers import TeacherSet, build_teachers
from dapo.serve.config import ServeConfig
from dapo.serve.server import OpenAIServer
from dapo.training import run as run_module
from dapo.training.loop import train
from tests.cli.cli_helpers import FAST
from tests.distillation.helpers import STUDENT, distill_overrides, perturbed_teacher
from tests.serve.serve_helpers import uvicorn_app

TOOLS_PRESET = str(Path(__file__).resolve().parents[2] / "configs" / "tools" / "tiny_calculator.yaml")
TOOLS = [
    "rollout.multi_turn.sandbox.mode=unsafe-no-isolation",
    "data.max_response_length=64",
    "algorithm.filter_groups.max_num_gen_batches=1",
]
ASYNC_WORKER = "async_training.rollout_num_threads=1"
REWARD_OFF = "distillation.distillation_loss.use_task_rewards=false"
DIRECT_K3 = ["distillation.distillation_loss.loss_mode=k3", "distillation.distillation_loss.use_policy_gradient=false"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> str:
    return perturbed_teacher(tmp_path_factory.mktemp("teacher") / "teacher")


def distilled_run(run_root: Path, teacher: str, *overrides: str, preset: str | None = None) -> list[dict]:
    """A 2-step `dapo train` with ``teacher`` and the reward off, validation off; its step records (1, 2)."""
    cfg = load_config(
        preset,
        [
            *FAST,
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.progress=false",
            *distill_overrides(teacher, REWARD_OFF),
            *overrides,
            f"trainer.default_local_dir={run_root}",
            "trainer.experiment_name=run",
        ],
    )
    assert train(cfg).steps_done == 2
    records = [json.loads(line) for line in (run_root / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    return steps


def assert_the_teacher_trains(steps: list[dict]) -> None:
    for r in steps:
        kl = r["distill/reverse_kl"]
        assert math.isfinite(kl) and kl != 0.0, r
        assert r["distill/teacher_log_prob_mean"] != r["distill/student_log_prob_mean"]
        assert r["timing_s/teacher"] > 0.0
        assert r["actor/grad_norm"] > 0.0, r  # the reward is off: this gradient is the teacher's


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_step_off", "fully_async"])
def test_the_async_loops_train_from_the_teacher(tmp_path: Path, teacher: str, mode: str) -> None:
    steps = distilled_run(tmp_path, teacher, f"async_training.mode={mode}", ASYNC_WORKER)
    assert_the_teacher_trains(steps)
    assert all(r["actor/pg_loss"] != 0.0 and r["distill/advantage_mean"] != 0.0 for r in steps)
    # off-policy samples: the student's log-probs the teacher is compared with are the actor's recomputed pi_old
    assert all(r["actor/old_log_prob_recomputed"] == 1.0 for r in steps)
    assert steps[1]["async/staleness/max"] == 1  # step 2 trained samples of the step-0 weights: async it was


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["pg_k1", "direct_k3"])
def test_a_lora_student_trains_from_the_teacher(tmp_path: Path, teacher: str, loss: str) -> None:
    steps = distilled_run(
        tmp_path, teacher, "actor_rollout_ref.model.lora_rank=8", *(DIRECT_K3 * (loss == "direct_k3"))
    )
    assert_the_teacher_trains(steps)
    if loss == "direct_k3":  # the divergence itself is the loss: k3 >= 0, and > 0 for another teacher
        assert all(r["actor/distill_loss"] > 0.0 for r in steps)
    else:
        assert all(r["actor/pg_loss"] != 0.0 for r in steps)


@pytest.mark.slow
def test_multi_turn_tool_rollouts_train_from_the_teacher(tmp_path: Path, teacher: str) -> None:
    steps = distilled_run(tmp_path, teacher, *TOOLS, preset=TOOLS_PRESET)
    assert_the_teacher_trains(steps)
    assert all(r["tool/calls"] > 0 for r in steps)


class _DisagreesOnToolTokensOnly:
    """The student as teacher, except on tool-output tokens, where it gives a log-prob of -30: a teacher whose only
    difference from the student is where the action mask says the model did not write."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name

    def log_probs(self, batch):
        assert batch.action_mask is not None, "multi-turn batches carry an action mask"
        out = self.inner.log_probs(batch)
        return [torch.where(mask, lp, torch.full_like(lp, -30.0)) for lp, mask in zip(out, batch.action_mask)]

    def identity(self) -> str:
        return self.inner.identity()

    def close(self) -> None:
        self.inner.close()


@pytest.mark.slow
def test_in_multi_turn_the_teacher_scores_action_tokens_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A teacher that equals the student on the model's tokens and differs wildly on the tool's gives exactly no
    signal at step 1 (the student has not moved yet): tool output is context, never a distillation target."""

    def tool_blind_teachers(cfg, **kwargs) -> TeacherSet | None:
        teachers = build_teachers(cfg, **kwargs)
        assert teachers is not None
        teachers.teachers = {n: _DisagreesOnToolTokensOnly(t) for n, t in teachers.teachers.items()}
        return teachers

    monkeypatch.setattr(run_module, "build_teachers", tool_blind_teachers)
    first = distilled_run(tmp_path, STUDENT, *TOOLS, preset=TOOLS_PRESET)[0]
    assert first["tool/calls"] > 0  # tool tokens were there to be masked
    assert first["distill/reverse_kl"] == 0.0
    assert first["distill/teacher_log_prob_mean"] == first["distill/student_log_prob_mean"]
    assert first["actor/grad_norm"] == 0.0


@pytest.fixture(scope="module")
def served_student() -> Iterator[str]:
    with uvicorn_app(OpenAIServer(ServeConfig(device="cpu", backend="hf"))) as port:  # the embedded tiny model
        yield f"http://127.0.0.1:{port}/v1"


@pytest.mark.slow
def test_a_served_teacher_scores_multi_turn_trajectories(tmp_path: Path, served_student: str) -> None:
    """The student served over loopback HTTP as the teacher of a multi-turn run: the trajectories (tool output
    included) go to the server as prompt ids, and at step 1 (the student not yet moved) its scores are the
    student's own up to float noise."""
    first = distilled_run(tmp_path, served_student, *TOOLS, preset=TOOLS_PRESET)[0]
    assert first["tool/calls"] > 0 and first["timing_s/teacher"] > 0.0
    assert abs(first["distill/reverse_kl"]) < 1e-4
