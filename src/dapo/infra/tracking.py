"""Metric tracking: one ``Tracker.log(metrics, step)`` call fans out to the chosen backends (JSONL, TensorBoard, W&B,
console: one class each in dapo.infra.loggers, by name in its registry).

JSONL (``run_dir/metrics.jsonl``) is the source of truth that ``dapo plot`` and the tests read: one
JSON object per line, ``{"step": N, "<metric>": value, ...}``. Each record is written unbuffered in one go,
so a crash can at worst leave one truncated last line, which :func:`read_metrics` skips with a warning and the next
:class:`Tracker` trims before appending; a write that fails (full disk) is cut back to the last whole record and
raised as a ``FileOperationError`` naming the file.
Non-finite values (NaN, +-inf) are written as JSON ``null`` - strict JSON has no NaN - and read back
as ``None``.

Resuming: call :func:`truncate_metrics_after` with the resumed step before opening the Tracker, so
records the crashed run wrote after its last checkpoint are dropped and no step appears twice.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from dapo.infra.atomic import atomic_write
from dapo.infra.loggers.base import MetricLogger, RunContext
from dapo.infra.loggers.jsonl_logger import METRICS_FILE_NAME
from dapo.infra.loggers.registry import LOGGER_NAMES, LOGGERS

__all__ = [
    "BACKENDS",
    "METRICS_FILE_NAME",
    "Tracker",
    "read_metrics",
    "truncate_metrics_after",
    "val_acc_keys",
]

logger = logging.getLogger(__name__)

# Validation accuracy is logged as val/acc/mean@k, k = rollout.val_kwargs.n; its /ci95 companion does not match.
_VAL_ACC_KEY = re.compile(r"^val/acc/mean@(\d+)$")


def val_acc_keys(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ``val/acc/mean@k`` keys the records hold, ordered by k."""
    ks = {int(m[1]) for record in records for key in record if (m := _VAL_ACC_KEY.match(key))}
    return [f"val/acc/mean@{k}" for k in sorted(ks)]


BACKENDS = LOGGER_NAMES  # the registry's names, in the order the backends open


def _clean_value(key: str, value: Any) -> int | float | None:
    """A metric value as JSON-ready number: int stays int, other numbers become float, non-finite None."""
    if isinstance(value, bool):
        raise TypeError(f"metric {key!r}: expected a number, got bool {value!r}")
    if isinstance(value, int):
        return value
    try:
        number = float(value)  # float, numpy scalars, 0-d tensors
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__} {value!r}") from exc
    return number if math.isfinite(number) else None


class Tracker:
    """Log scalar metrics per step to the chosen backends (dapo.infra.loggers.registry.LOGGERS, one class each).

    Backends: ``"jsonl"`` (``run_dir/metrics.jsonl``, appended), ``"tensorboard"``
    (``run_dir/tensorboard``), ``"wandb"`` (lazy import; ``wandb_mode="offline"`` or the
    ``WANDB_MODE`` environment variable works without a network; the run id is kept in
    ``run_dir/wandb_run_id.txt`` so a resumed run continues the same W&B run) and ``"console"`` (one
    line per step on stdout). ``config`` is recorded by TensorBoard (as text) and W&B. The Tracker checks and cleans
    the values once; the backends open, record and close in the registry's order.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        backends: Sequence[str],
        project: str,
        experiment: str,
        config: Mapping[str, Any],
        wandb_mode: str | None = None,
        console_file: TextIO | None = None,
    ) -> None:
        if isinstance(backends, str):
            raise TypeError(f"Tracker: backends must be a sequence of names, got the string {backends!r}")
        unknown = [b for b in backends if b not in LOGGERS]
        if unknown:
            raise ValueError(f"Tracker: unknown backend(s) {unknown}; choose from {list(LOGGER_NAMES)}")
        self.run_dir = Path(run_dir)
        self.backends: tuple[str, ...] = tuple(dict.fromkeys(backends))
        self.project = project
        self.experiment = experiment
        self._closed = False
        self._loggers: list[MetricLogger] = []
        self.run_dir.mkdir(parents=True, exist_ok=True)
        context = RunContext(self.run_dir, project, experiment, config, wandb_mode, console_file)
        try:
            for name, logger_class in LOGGERS.items():
                if name in self.backends:
                    self._loggers.append(logger_class(context))
        except BaseException:
            self.close()
            raise

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` (name -> number) at training step ``step`` on every backend."""
        if self._closed:
            raise RuntimeError("Tracker.log called after close()")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"Tracker.log: step must be an int >= 0, got {step!r}")
        values: dict[str, int | float | None] = {}
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise TypeError(f"Tracker.log: metric names must be str, got {key!r}")
            if key == "step":
                raise ValueError("Tracker.log: 'step' is reserved for the step number; rename that metric")
            values[key] = _clean_value(key, value)
        for sink in self._loggers:
            sink.log(values, step)

    def close(self) -> None:
        """Flush and close every backend; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for sink in self._loggers:
            sink.close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _read_lines(path: Path, bad: list[bytes] | None = None) -> list[tuple[bytes, dict[str, Any]]]:
    """(raw line, parsed record) for each record; a malformed line is skipped with a warning (and added to ``bad``).

    A malformed last line is what a crash mid-write leaves; one in the middle is damage (a stray write, a bad copy):
    neither may block reading or resuming.
    """
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: list[tuple[bytes, dict[str, Any]]] = []
    last_index = len(lines) - 1
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not an object with an integer 'step'")
        except ValueError as exc:
            # The last chunk has no newline after it only when a write was cut short.
            if index == last_index:
                logger.warning("%s: skipping truncated last line %d (%s)", path, index + 1, exc)
                continue
            logger.warning("%s: skipping line %d, not a metrics record (%s): %r", path, index + 1, exc, line[:80])
            if bad is not None:
                bad.append(line)
            continue
        records.append((line, record))
    return records


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All records of ``run_dir/metrics.jsonl`` in file order (``None`` where a value was non-finite)."""
    path = Path(run_dir) / METRICS_FILE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE_NAME} in {run_dir}")
    return [record for _line, record in _read_lines(path)]


def truncate_metrics_after(run_dir: Path, step: int) -> int:
    """Drop records with ``step`` greater than ``step`` (atomic rewrite); return how many were dropped.

    Call it when resuming from the checkpoint of ``step``, before opening a :class:`Tracker`. A missing
    file is not an error (returns 0). Kept records are written back byte for byte; malformed lines in the middle of
    the file are moved to ``metrics.jsonl.bad`` (appended), not lost.
    """
    path = Path(run_dir) / METRICS_FILE_NAME
    if not path.is_file():
        return 0
    bad: list[bytes] = []
    records = _read_lines(path, bad)
    if bad:
        quarantine = path.with_name(METRICS_FILE_NAME + ".bad")
        old = quarantine.read_bytes() if quarantine.is_file() else b""
        atomic_write(quarantine, old + b"".join(line + b"\n" for line in bad))
        logger.warning("%s: moved %d malformed lines to %s", path, len(bad), quarantine)
    kept = [line for line, record in records if record["step"] <= step]
    dropped = len(records) - len(kept)
    atomic_write(path, b"".join(line + b"\n" for line in kept))
    if dropped:
        logger.info("%s: dropped %d records after step %d (resumed run)", path, dropped, step)
    return dropped
