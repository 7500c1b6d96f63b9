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
from dapo.infra.checkpoint import find_latest_checkpoint, load_checkpoint, save_checkpoint
from dapo.model.loading import Policy
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.dynamic_sampling_buffer import DynamicSamplingBuffer


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
    """The checkpoint ``trainer.resume_mode`` asks for: the latest complete one ('auto'), none, or a given path."""
    mode = cfg.trainer.resume_mode
    if mode == "disable":
        return None
    return find_latest_checkpoint(run_dir / "checkpoints") if mode == "auto" else Path(mode)


def resume_run(path: Path, state: RunState, policy: Policy, optimizer, scheduler) -> None:
    """Load weights, optimizer, scheduler, RNG and run state from the checkpoint at ``path``."""
    state.load_state_dict(load_checkpoint(path, model=policy.model, optimizer=optimizer, scheduler=scheduler))
