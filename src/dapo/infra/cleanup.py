"""Clean-up that never hides the error it runs after."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


def close_quietly(closers: Sequence[tuple[str, Callable[[], object]]]) -> None:
    """Close each resource (``[(what, close), ...]``, all of them, in order) and log a failure as a warning.

    Called in a ``finally``: an exception from a close would replace the error that ended the run, and that one,
    not the clean-up's, is what the user must see. A close that fails after a run that succeeded loses nothing (the
    checkpoints and metrics are written), so it is a warning too.
    """
    for what, close in closers:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - any failure to clean up is reported the same way
            log.warning("closing %s failed (%s: %s); carrying on with the clean-up", what, type(exc).__name__, exc)
