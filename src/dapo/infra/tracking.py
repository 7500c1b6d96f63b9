"""Metric tracking: one ``Tracker.log(metrics, step)`` call fans out to JSONL, TensorBoard, W&B, console.

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

import contextlib
import json
import logging
import math
import os
import re
import secrets
import string
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from dapo.infra.atomic import FileOperationError, atomic_write

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

METRICS_FILE_NAME = "metrics.jsonl"
BACKENDS = ("jsonl", "tensorboard", "wandb", "console")
_WANDB_ID_FILE = "wandb_run_id.txt"


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


def _format_console(step: int, values: Mapping[str, int | float | None]) -> str:
    parts = [f"step {step}"]
    for key, value in values.items():
        parts.append(f"{key}={'nan' if value is None else (value if isinstance(value, int) else f'{value:.4g}')}")
    return " | ".join(parts)


class Tracker:
    """Log scalar metrics per step to the chosen backends.

    Backends: ``"jsonl"`` (``run_dir/metrics.jsonl``, appended), ``"tensorboard"``
    (``run_dir/tensorboard``), ``"wandb"`` (lazy import; ``wandb_mode="offline"`` or the
    ``WANDB_MODE`` environment variable works without a network; the run id is kept in
    ``run_dir/wandb_run_id.txt`` so a resumed run continues the same W&B run) and ``"console"`` (one
    line per step on stdout). ``config`` is recorded by TensorBoard (as text) and W&B.
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
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"Tracker: unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
        self.run_dir = Path(run_dir)
        self.backends: tuple[str, ...] = tuple(dict.fromkeys(backends))
        self.project = project
        self.experiment = experiment
        self._closed = False
        self._jsonl: TextIO | None = None
        self._tb: Any = None
        self._wandb_run: Any = None
        self._console = console_file
        self.run_dir.mkdir(parents=True, exist_ok=True)

        try:
            if "jsonl" in self.backends:
                path = self.run_dir / METRICS_FILE_NAME
                _trim_partial_last_line(path)
                # Unbuffered: a record that fails to write is cut off at once, and no buffer is left for close() to
                # fail on again (that second error would replace the first).
                self._jsonl = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
            if "tensorboard" in self.backends:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
                config_text = json.dumps(dict(config), indent=2, default=str)
                self._tb.add_text("config", f"```\n{config_text}\n```", global_step=0)
                self._tb.flush()
            if "wandb" in self.backends:
                self._wandb_run = self._init_wandb(dict(config), wandb_mode)
        except BaseException:
            self.close()
            raise

    def _init_wandb(self, config: dict[str, Any], mode: str | None) -> Any:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                "Tracker backend 'wandb' needs the wandb package, which is not installed: "
                "pip install 'dapo[wandb]' (or drop 'wandb' from the tracking backends)"
            ) from exc
        id_file = self.run_dir / _WANDB_ID_FILE
        if id_file.is_file():
            run_id = id_file.read_text(encoding="utf-8").strip()
        else:  # W&B run ids: short, lowercase alphanumeric
            run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        kwargs: dict[str, Any] = {
            "project": self.project,
            "name": self.experiment,
            "config": config,
            "dir": str(self.run_dir),
            "id": run_id,
            "resume": "allow",
        }
        if mode is not None:
            kwargs["mode"] = mode
        run = wandb.init(**kwargs)
        if not id_file.is_file():
            id_file.write_text(run_id + "\n", encoding="utf-8")
        return run

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

        if self._jsonl is not None:
            self._append_record((json.dumps({"step": step, **values}, allow_nan=False) + "\n").encode("utf-8"),
                                step)
        if self._tb is not None:
            for key, value in values.items():
                self._tb.add_scalar(key, math.nan if value is None else value, global_step=step)
            self._tb.flush()
        if self._wandb_run is not None:
            self._wandb_run.log({k: (math.nan if v is None else v) for k, v in values.items()}, step=step)
        if "console" in self.backends:
            print(_format_console(step, values), file=self._console or sys.stdout, flush=True)

    def _append_record(self, record: bytes, step: int) -> None:
        """Append one record, all of it or nothing: a failed write (full disk, file size limit, a folder gone
        read-only) is cut back to the last complete record and raised as a ``FileOperationError`` naming the file."""
        assert self._jsonl is not None
        path = self.run_dir / METRICS_FILE_NAME
        start = self._jsonl.seek(0, os.SEEK_END)
        try:
            view = memoryview(record)
            while view:  # a raw write may be short (the last bytes before a size limit)
                view = view[self._jsonl.write(view):]
        except OSError as exc:
            with contextlib.suppress(OSError):  # the file keeps its complete records; a resume trims the rest anyway
                self._jsonl.truncate(start)
            raise FileOperationError(exc, f"appending the metrics of step {step} to {path}") from exc

    def close(self) -> None:
        """Flush and close every backend; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb_run is not None:
            self._wandb_run.finish()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _trim_partial_last_line(path: Path) -> None:
    """Cut a last line without its newline (a crash mid-write) so appended records start on their own line."""
    if not path.is_file():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        keep = data.rfind(b"\n") + 1
        logger.warning("%s: dropping truncated last line %r left by a crash", path, data[keep:][:80])
        f.truncate(keep)


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
