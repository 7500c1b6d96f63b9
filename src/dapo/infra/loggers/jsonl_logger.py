"""``metrics.jsonl``: the run record that ``dapo plot``, resume truncation and the tests read (format:
dapo.infra.tracking). Each record is written unbuffered in one go, so a crash leaves at worst one truncated last
line, which the next open trims; a failed write is cut back to the last whole record."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import ClassVar

from dapo.infra.atomic import FileOperationError
from dapo.infra.loggers.base import RunContext, Values

METRICS_FILE_NAME = "metrics.jsonl"
logger = logging.getLogger(__name__)


class JsonlLogger:
    name: ClassVar[str] = "jsonl"

    def __init__(self, context: RunContext) -> None:
        self.path = context.run_dir / METRICS_FILE_NAME
        trim_partial_last_line(self.path)
        # Unbuffered: a record that fails to write is cut off at once, and no buffer is left for close() to
        # fail on again (that second error would replace the first).
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed in close()

    def log(self, values: Values, step: int) -> None:
        self._append_record((json.dumps({"step": step, **values}, allow_nan=False) + "\n").encode("utf-8"), step)

    def _append_record(self, record: bytes, step: int) -> None:
        """Append one record, all of it or nothing: a failed write (full disk, file size limit, a folder gone
        read-only) is cut back to the last complete record and raised as a ``FileOperationError`` naming the file."""
        start = self._file.seek(0, os.SEEK_END)
        try:
            view = memoryview(record)
            while view:  # a raw write may be short (the last bytes before a size limit)
                view = view[self._file.write(view) :]
        except OSError as exc:
            with contextlib.suppress(OSError):  # the file keeps its complete records; a resume trims the rest anyway
                self._file.truncate(start)
            raise FileOperationError(exc, f"appending the metrics of step {step} to {self.path}") from exc

    def close(self) -> None:
        self._file.close()


def trim_partial_last_line(path: Path) -> None:
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
