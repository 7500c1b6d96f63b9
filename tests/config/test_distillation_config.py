"""verl's distillation keys, accepted as written; those without meaning here warned in one line; bad combinations
refused naming the key."""

from __future__ import annotations

import pytest

from dapo.config import ConfigError, build_config
from dapo.config.loading import build_config_with_report

TEACHER = ["distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/teacher"]


def test_verl_keys_as_written() -> None:
    cfg, report = build_config_with_report(
        None,
        [
            *TEACHER,
            "distillation.distillation_loss.loss_mode=k1",
            "distillation.distillation_loss.use_policy_gradient=true",
            "distillation.distillation_loss.use_task_rewards=false",
            "distillation.distillation_loss.policy_loss_mode=vanilla",
            "distillation.nnodes=1",
            "distillation.teacher_models.teacher_model.num_replicas=2",
            "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2",
        ],
    )
    loss = cfg.distillation.distillation_loss
    assert (loss.loss_mode, loss.use_policy_gradient, loss.use_task_rewards) == ("k1", True, False)
    assert cfg.distillation.teacher_models["teacher_model"].model_path == "/teacher"
    warned = [w for w in report.warnings if "accepted without effect" in w]
    assert len(warned) == 2 and "num_replicas" in warned[0] and "inference.tensor_model_parallel_size" in warned[1]
    assert not cfg.filters_groups  # Eq. 11 drops nothing with the reward off


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "use_policy_gradient=true"),  # default k3 is fine; k1 direct is not
        (
            [
                "distillation.distillation_loss.loss_mode=forward_kl_topk",
                "distillation.distillation_loss.use_policy_gradient=true",
            ],
            "needs use_policy_gradient=false",
        ),
        (["distillation.teacher_models.second.model_path=/t2"], "set distillation.teacher_models.second.key"),
        (["distillation.teacher_models.teacher_model.modle_path=/x"], "Did you mean 'model_path'"),
        (["distillation.distillation_loss.policy_loss_mode=gspo"], "only 'vanilla' is supported"),
    ],
)
def test_bad_combinations_are_refused_naming_the_key(extra: list[str], says: str) -> None:
    overrides = [*TEACHER, *extra] + (["distillation.distillation_loss.loss_mode=k1"] if not extra else [])
    with pytest.raises(ConfigError, match=says):
        build_config(None, overrides)


def test_enabled_without_a_teacher_says_which_key_to_set() -> None:
    with pytest.raises(ConfigError, match="distillation.teacher_models.teacher_model.model_path"):
        build_config(None, ["distillation.enabled=true"])
