"""Stop a run whose optimizer steps keep being skipped, instead of letting it end with exit 0 and an untrained model.

The update skips an optimizer step whose gradient norm is not finite (dapo.actor.update: ``actor/num_skipped_steps``).
One such step is a glitch worth surviving; a run where every step is skipped (say ``lora_alpha=1e30``, whose gradient
norm is inf) trains nothing while looking successful. The count is kept per training step: a training step whose
update took no optimizer step adds its skipped steps to the run of consecutive ones; any step that was taken resets it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo.training.errors import TrainingError

__all__ = ["SkippedStepGuard"]


@dataclass
class SkippedStepGuard:
    """Counts consecutive skipped optimizer steps; raises ``TrainingError`` once they exceed ``limit``
    (``trainer.max_consecutive_skipped_steps``; 0 = never stop)."""

    limit: int
    consecutive: int = 0

    def observe(self, step: int, metrics: dict[str, float]) -> None:
        skipped = int(metrics.get("actor/num_skipped_steps", 0))
        taken = int(metrics.get("actor/num_optimizer_steps", 0))
        if taken > 0:
            self.consecutive = 0
            return
        self.consecutive += skipped
        if self.limit > 0 and self.consecutive >= self.limit:
            raise TrainingError(
                f"step {step}: {self.consecutive} consecutive optimizer steps were skipped (gradient norm not finite), "
                f"so the run is not training; check actor.optim.lr, model.lora_alpha and actor.grad_clip "
                f"(trainer.max_consecutive_skipped_steps={self.limit}; 0 = never stop)"
            )
