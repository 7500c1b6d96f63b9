"""Which checkpoints a folder holds and which one a resume takes: the newest that verifies, each newer one skipped
with a logged reason, so a resume never silently starts from a damaged or half-written checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path

from dapo.infra.atomic import atomic_write, os_error_reason
from dapo.infra.checkpoint.layout import LATEST_FILE_NAME, STEP_DIR_RE, TEMP_PREFIX, TRASH_PREFIX
from dapo.infra.checkpoint.manifest import manifest_problem

logger = logging.getLogger(__package__)  # the package's one logger: its name is what filters and log lines show


def complete_checkpoints(ckpt_root: Path, *, log_skipped: bool = False) -> dict[int, Path]:
    """The complete checkpoints under ``ckpt_root`` by step (sizes checked, not checksums); ``log_skipped`` warns of
    each folder passed over, and why."""
    found: dict[int, Path] = {}
    if not ckpt_root.is_dir():
        return found
    for entry in sorted(ckpt_root.iterdir()):
        if not entry.is_dir():
            continue
        if entry.name.startswith((TEMP_PREFIX, TRASH_PREFIX)):
            if log_skipped:
                logger.warning("skipping %s: partial folder of an interrupted checkpoint save", entry)
            continue
        match = STEP_DIR_RE.match(entry.name)
        if not match:
            continue
        problem = manifest_problem(entry)
        if problem is not None:
            if log_skipped:
                logger.warning("skipping incomplete checkpoint %s: %s", entry, problem)
            continue
        found[int(match.group(1))] = entry
    return found


def find_latest_checkpoint(ckpt_root: Path, *, verify: bool = True) -> Path | None:
    """The checkpoint with the highest step under ``ckpt_root`` that verifies (``verify=False``: that is complete).

    Temp folders and checkpoints whose manifest is missing or does not match the files (sizes, checksums) are
    skipped, each one logged as a warning naming it and the reason.
    """
    complete = complete_checkpoints(Path(ckpt_root), log_skipped=True)
    for step in sorted(complete, reverse=True):
        problem = manifest_problem(complete[step], verify=True) if verify else None
        if problem is None:
            return complete[step]
        logger.warning("skipping checkpoint %s: %s; falling back to an older one", complete[step], problem)
    return None


def update_latest_file(ckpt_root: Path, step: int) -> None:
    """Atomically point ``latest_checkpointed_iteration.txt`` at ``step`` (best effort: the scan is authoritative)."""
    target = ckpt_root / LATEST_FILE_NAME
    try:
        atomic_write(target, f"{step}\n")
    except OSError as exc:
        logger.warning(
            "checkpoint global_step_%d is complete but %s could not be updated (%s); "
            "find_latest_checkpoint scans the folders and still finds it",
            step,
            target,
            os_error_reason(exc),
        )
