"""When the trainer pushes its weights into the rollout engine (``async_training.trigger_parameter_sync_step``), and
how far behind the actor that lets a sample's weights be (docs/async.md, "Pushing every k steps").

A version is the trainer step whose weights the engine holds. With ``trigger_parameter_sync_step=k`` (verl's fully
async key: optimizer steps between two parameter syncs) the trainer pushes after every step that is a multiple of k,
and after the run's last step (its final validation and whatever serves the engine next see the trained weights);
the run's first push is the step it starts from (0, or a resumed checkpoint's). So the engine only ever holds the
versions of push steps, and the actor of step j has passed the push ``latest_push(j - 1)``.

The bounds, in versions (steps), as the samples' lags are measured and checked:

- ``fully_async`` counts ``staleness_threshold = s`` in pushes, as verl does (its rollouter may run s sync windows
  of k steps ahead): batch j starts once the engine holds weights at most s pushes older than ``latest_push(j-1)``,
  i.e. ``version >= latest_push(j-1) - s*k``. A sample's lag is then at most ``(s+1)*k - 1`` steps (k=1: s).
- ``one_step_off`` draws batch j while step j-1 trains, from the weights ``latest_push(j-2)``: at most k steps old
  (k=1: exactly 1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PushSchedule:
    """The push steps of a run (module docstring): every ``every`` steps, the ``last`` step, and ``start``."""

    every: int
    start: int
    last: int

    @classmethod
    def of_run(cls, run) -> PushSchedule:
        """The schedule of ``run`` (a ``dapo.training.run.Run``, or anything with its cfg, state and total_steps)."""
        return cls(run.cfg.async_training.trigger_parameter_sync_step, run.state.step, run.total_steps)

    def due(self, step: int) -> bool:
        """The trainer pushes after ``step``."""
        return step % self.every == 0 or step == self.last

    def latest_push(self, version: int) -> int:
        """The newest version pushed by the time the actor holds ``version`` (before ``version``'s own push is
        decided: the pushes of steps up to ``version``, the run's first push included)."""
        return max(self.start, version // self.every * self.every)

    def fully_async_start(self, batch: int, staleness_threshold: int) -> int:
        """The oldest engine version batch ``batch`` may start from under ``fully_async``: ``staleness_threshold``
        pushes before the newest one step ``batch``'s actor has passed."""
        return self.latest_push(batch - 1) - staleness_threshold * self.every

    def fully_async_bound(self, staleness_threshold: int) -> int:
        """The largest lag, in steps, of a sample under ``fully_async``: ``(s + 1) * k - 1``."""
        return (staleness_threshold + 1) * self.every - 1

    def one_step_off_bound(self) -> int:
        """The largest lag, in steps, of a sample under ``one_step_off``: k."""
        return self.every
