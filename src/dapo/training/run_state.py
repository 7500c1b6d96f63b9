"""What a run must carry across a checkpoint besides weights and optimizer: one object with state_dict/load_state_dict.

The step, the prompt sampler's position, the dynamic-sampling buffer (groups carried over between steps) and the
validation history. ``save_run`` / ``resume_run`` put it, the policy, the optimizer and the scheduler into (and back
out of) one atomic checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.config import DapoConfig
from dapo.data.prompt_sampler import PromptSampler
from dapo.infra.checkpoint import (CheckpointError, checkpoint_problems, find_latest_checkpoint, load_checkpoint,
                                   save_checkpoint)
from dapo.model.loading import Policy
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.dynamic_sampling_buffer import DynamicSamplingBuffer
from dapo.training.errors import TrainingError


@dataclass
class RunState:
    sampler: PromptSampler
    buffer: DynamicSamplingBuffer[ScoredGroup]
    step: int = 0
    val_history: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "sampler": self.sampler.state_dict(),
            "accumulator": self.buffer.state_dict(to_state=lambda g: g.to_state()),
            "val_history": self.val_history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.buffer.load_state_dict(state["accumulator"], from_state=ScoredGroup.from_state)
        self.val_history = [tuple(x) for x in state.get("val_history", [])]


def save_run(run_dir: Path, state: RunState, policy: Policy, optimizer, scheduler, cfg: DapoConfig) -> Path:
    """Checkpoint ``run_dir/checkpoints/global_step_{state.step}`` atomically (see ``dapo.infra.checkpoint``)."""
    return save_checkpoint(run_dir / "checkpoints", state.step, model=policy.model, tokenizer=policy.tokenizer,
                           optimizer=optimizer, scheduler=scheduler, trainer_state=state.state_dict(),
                           keep_last=cfg.trainer.max_ckpt_to_keep)


def find_resume_checkpoint(run_dir: Path, cfg: DapoConfig) -> Path | None:
    """The checkpoint ``trainer.resume_mode`` asks for: the latest one that verifies ('auto'), none, or a given path.

    'auto' never silently starts over: when checkpoints exist but none verifies it stops with a ``TrainingError``
    naming each and why (``trainer.resume_mode=disable`` starts afresh, on purpose).
    """
    mode = cfg.trainer.resume_mode
    if mode == "disable":
        return None
    if mode != "auto":
        path = Path(mode)
        if not path.exists():
            raise TrainingError(f"trainer.resume_mode: checkpoint '{path}' does not exist")
        return path
    ckpt_root = run_dir / "checkpoints"
    latest = find_latest_checkpoint(ckpt_root)
    if latest is None:
        problems = checkpoint_problems(ckpt_root)
        if problems:
            listing = "; ".join(f"{p.name}: {why}" for p, why in problems.items())
            raise TrainingError(
                f"every checkpoint under {ckpt_root} is unusable ({listing}). Refusing to start this run over from "
                "step 0, which would drop its metrics and overwrite its checkpoints: restore a checkpoint, or set "
                "trainer.resume_mode=disable to start afresh on purpose"
            )
    return latest


def resume_run(path: Path, state: RunState, policy: Policy, optimizer, scheduler) -> None:
    """Load weights, optimizer, scheduler, RNG and run state from the checkpoint at ``path``.

    A checkpoint that fails verification or cannot be read stops with a ``TrainingError`` naming the file."""
    try:
        state.load_state_dict(load_checkpoint(path, model=policy.model, optimizer=optimizer, scheduler=scheduler))
    except CheckpointError as exc:
        raise TrainingError(f"cannot resume: {exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:  # a manifest-less old checkpoint whose state does not fit
        raise TrainingError(f"cannot resume from {path}: its trainer state does not fit this run "
                            f"({type(exc).__name__}: {exc})") from exc
