"""Helpers of the data-layer tests: real files written to a temp folder, never mocks."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def good_row(i: int = 0, *, answer: str = "34") -> dict[str, Any]:
    """A valid DAPO-schema row."""
    return {
        "data_source": "unit",
        "prompt": [{"role": "user", "content": f"What is {i} + 34 - {i}?"}],
        "ability": "math",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": i},
    }


def write_jsonl_rows(path: Path, rows: Sequence[Any]) -> Path:
    """Write arbitrary JSON values, one per line (no validation: bad rows on purpose)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_parquet_rows(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write arbitrary rows with pyarrow's own type inference (no validation: bad rows on purpose)."""
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


RowWriter = Callable[[Path, Sequence[Any]], Path]
