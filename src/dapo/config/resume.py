"""Resuming honestly: a run directory is continued only with the hyper-parameters it was started with.

``resume_conflicts`` compares the ``config.yaml`` a run directory holds with the config of the new command and
lists every changed key except those that may change between invocations of one run (its length, logging,
checkpoint frequency, threads, the resume switches themselves). ``check_resume`` turns a non-empty list into one
``ConfigError`` naming the keys, unless ``trainer.resume_with_changes=true``. What is compared is the configuration
saved with the checkpoint being resumed (every checkpoint records what made it), or the run's ``config.yaml`` for a
checkpoint without one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from dapo.config.loading import _flatten, brief, config_to_dict, config_tree_problem
from dapo.config.schema import ConfigError, DapoConfig

__all__ = ["MAY_CHANGE_ON_RESUME", "check_resume", "resume_conflicts"]

MAY_CHANGE_ON_RESUME: frozenset[str] = frozenset(
    {
        "trainer.total_training_steps",
        "trainer.total_epochs",
        "trainer.test_freq",
        "trainer.save_freq",
        "trainer.max_ckpt_to_keep",
        "trainer.resume_mode",
        "trainer.resume_with_changes",
        "trainer.logger",
        "trainer.default_local_dir",
        "trainer.experiment_name",  # where the run lives: a run directory may be moved
        "trainer.rollout_data_dir",  # a record of the batches, like the logger: it changes no number of the run
        "trainer.profile_steps",  # the profiler observes a step; it changes no number of it
        "trainer.progress",
        "trainer.num_threads",
        "trainer.val_before_train",
        "trainer.project_name",
        "data.val_max_samples",
        "reward_model.num_workers",
        "reward_model.timeout_s",
        "rollout.max_batch_size",
        # how the same math is laid out on devices and on disk: every checkpoint format loads under every strategy and
        # world size, and every micro-batch layout gives the same gradient, so a run may move between them
        "actor.strategy",
        "actor.fsdp.cpu_offload",
        "trainer.checkpoint_format",
        "actor.layout",
    }
)


def resume_conflicts(saved: Mapping[str, Any], cfg: DapoConfig) -> list[str]:
    """``key: old -> new`` for every key that differs between a saved config dict and ``cfg`` (see the module)."""
    old, new = _flatten(saved), _flatten(config_to_dict(cfg))
    lines = []
    for key in sorted(set(old) | set(new)):
        if key in MAY_CHANGE_ON_RESUME or old.get(key) == new.get(key):
            continue
        if key not in old:  # a key added to dapo after the run started: its default is what the run had
            continue
        lines.append(f"{key}: {brief(old.get(key, '<absent>'))} -> {brief(new.get(key, '<absent>'))}")
    return lines


def check_resume(run_dir: str | Path, cfg: DapoConfig, saved_config: Mapping[str, Any] | None = None) -> None:
    """Raise ``ConfigError`` when the run being resumed had other hyper-parameters than ``cfg`` (and
    ``trainer.resume_with_changes`` is false).

    ``saved_config``: the configuration saved with the checkpoint being resumed (what made it); without one (a
    checkpoint from before configurations were saved with checkpoints) ``run_dir/config.yaml`` is compared. A run
    directory without a readable config.yaml passes."""
    path = Path(run_dir) / "config.yaml"
    where = f"{path.parent} holds a run started"
    saved: Any = saved_config
    if saved is None:
        try:
            saved = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return
    else:
        where = f"the checkpoint to resume in {path.parent} was made"
    if not isinstance(saved, dict) or cfg.trainer.resume_with_changes:
        return
    problem = config_tree_problem(saved, str(path))
    if problem is not None:
        raise ConfigError(problem)
    changed = resume_conflicts(saved, cfg)
    if changed:
        raise ConfigError(
            f"{where} with other hyper-parameters; resuming it would mix the two and "
            f"overwrite its config.yaml. Changed ({len(changed)}):\n  " + "\n  ".join(changed) + "\n"
            "Use another trainer.experiment_name (or trainer.resume_mode=disable to start over there), or pass "
            "trainer.resume_with_changes=true to continue with the new values."
        )
