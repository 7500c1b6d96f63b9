"""Restarting a rollout worker process that died, within a budget: a few deaths are survived, a crash loop is not.

A death costs the batch in flight (generated again from the same seeds after the restart) and one push of the
current weights into the new process; ``async/worker_restarts`` counts the restarts of the run.
"""

from __future__ import annotations

import time
from collections import deque

from dapo.training.errors import TrainingError

MAX_RESTARTS = 3  # within WINDOW_S: more is a crash loop (a worker that dies at every start, a machine out of memory)
WINDOW_S = 600.0


class WorkerRestartGuard:
    """Allows ``max_restarts`` restarts within any ``window_s`` seconds; the next raises TrainingError."""

    def __init__(self, max_restarts: int = MAX_RESTARTS, window_s: float = WINDOW_S) -> None:
        self.max_restarts, self.window_s = max_restarts, window_s
        self._times: deque[float] = deque()

    def allow(self, cause: BaseException, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if len(self._times) >= self.max_restarts:
            raise TrainingError(
                f"{cause}; the rollout worker died {len(self._times) + 1} times within "
                f"{self.window_s:.0f} s, so it is not restarted again"
            )
        self._times.append(now)
