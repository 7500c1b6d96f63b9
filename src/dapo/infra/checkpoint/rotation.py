"""Deleting old checkpoints (``keep_last``) without ever keeping a corrupt one in place of a good one."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from dapo.infra.checkpoint.discovery import complete_checkpoints
from dapo.infra.checkpoint.manifest import manifest_problem

logger = logging.getLogger(__package__)  # the package's one logger: its name is what filters and log lines show


def rotate_checkpoints(ckpt_root: Path, new_step: int, keep_last: int) -> list[Path]:
    """Delete checkpoints older than ``new_step`` so that the newest ``keep_last`` good ones remain; return the deleted.

    The checkpoint of ``new_step`` (just written and hashed) counts as one of the ``keep_last``. Older complete
    checkpoints are verified (checksums) newest first, until ``keep_last - 1`` good ones are found: a checkpoint that
    fails to verify is never counted, so it never takes the place of a good one. Good checkpoints beyond those, and
    failed ones older than the oldest kept checkpoint, are deleted; a failed one newer than that is left in place (and
    logged) so it can be inspected, and so is every failed one while fewer good ones than that exist. Checkpoints with
    a higher step than ``new_step`` are never deleted. Verifying reads the kept checkpoints once more per save (about
    1 GB/s), the price of never keeping a corrupt one instead of a good one.
    """
    ckpt_root = Path(ckpt_root)
    complete = complete_checkpoints(ckpt_root)
    keep_older = keep_last - 1
    kept: list[int] = []
    failed: list[int] = []
    doomed: list[int] = []
    for step in sorted((s for s in complete if s < new_step), reverse=True):
        if len(kept) >= keep_older:
            doomed.append(step)
            continue
        problem = manifest_problem(complete[step], verify=True)
        if problem is None:
            kept.append(step)
        else:
            logger.warning(
                "checkpoint %s does not verify (%s): not counted among the %d kept", complete[step], problem, keep_last
            )
            failed.append(step)
    if len(kept) == keep_older:  # the quota of good ones is full: a failed one older than all of them is no use
        oldest_kept = min(kept, default=new_step)
        doomed += [s for s in failed if s < oldest_kept]
    deleted = []
    for step in sorted(doomed):
        logger.info("keep_last=%d: deleting old checkpoint %s", keep_last, complete[step])
        try:
            shutil.rmtree(complete[step])
            deleted.append(complete[step])
        except OSError as exc:
            logger.warning("could not delete old checkpoint %s: %s", complete[step], exc)
    newer = sorted(s for s in complete if s > new_step)
    if newer:
        logger.warning(
            "checkpoints %s are newer than the one just saved (step %d); find_latest_checkpoint will prefer them",
            [complete[s].name for s in newer],
            new_step,
        )
    return deleted
