"""Read and write DAPO data sets: parquet (the verl/DAPO layout) and JSON lines.

`load_records` / `load_dataset` validate every row and raise one `DataValidationError` naming the
file, row and field of every bad record (see `dapo.data.schema`). Columns other than the five
schema fields (e.g. pandas' ``__index_level_0__`` in the AIME 2024 file) are ignored.

`write_parquet` writes the exact nested schema of the DAPO release::

    data_source: string
    prompt: list<struct<content: string, role: string>>
    ability: string
    reward_model: struct<ground_truth: string, style: string>
    extra_info: struct<...>      # inferred from the values; the union of the records' keys

so verl-style loaders (``datasets``/pandas, ``row["extra_info"].get("index")``) read it. A record
without some ``extra_info`` key that others have reads back with that key set to None; when no
record has any ``extra_info`` key the column is left out (reading treats it as ``{}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dapo.data.schema import DapoRecord, DataFileError, DataProblem, DataValidationError, check_row
from dapo.infra.atomic import atomic_write, atomic_write_files, describe_os_error

PARQUET_SUFFIXES = (".parquet",)
JSON_SUFFIXES = (".jsonl", ".json")

MESSAGE_TYPE = pa.struct([("content", pa.string()), ("role", pa.string())])
REWARD_MODEL_TYPE = pa.struct([("ground_truth", pa.string()), ("style", pa.string())])


def _existing_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise DataFileError(f"{p}: no such file")
    if not p.is_file():
        raise DataFileError(f"{p}: not a file")
    suffix = p.suffix.lower()
    if suffix not in PARQUET_SUFFIXES + JSON_SUFFIXES:
        raise DataFileError(f"{p}: unsupported file type {p.suffix!r} (expected .parquet, .jsonl or .json)")
    return p


def _not_utf8(error: UnicodeDecodeError, column: int | None = None) -> str:
    where = f" at column {column}" if column is not None else ""
    return f"not UTF-8 text: byte 0x{error.object[error.start]:02x}{where} ({error.reason})"


def read_parquet_rows(path: Path) -> list[dict[str, Any]]:
    """All rows of a parquet file as plain dicts (nested structs become dicts, lists lists).

    A string column holding bytes that are not UTF-8 (parquet writers need not check) is reported by row, not by the
    offset inside the column that the decoder sees.
    """
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataFileError(f"{path}: cannot read as parquet: {e}") from e
    try:
        return table.to_pylist()
    except UnicodeDecodeError:
        pass
    problems = []
    for i in range(table.num_rows):  # only on this failure path: row by row, to name every bad row
        try:
            table.slice(i, 1).to_pylist()
        except UnicodeDecodeError as e:
            problems.append(DataProblem(str(path), i, "<row>", _not_utf8(e)))
    raise DataValidationError(problems)


def iter_json_rows(path: Path) -> Iterator[tuple[int | None, Any, str | None]]:
    """(line number or None, parsed value, JSON error or None) for each record of a JSON file.

    ``.jsonl`` is JSON lines (blank lines skipped). ``.json`` is JSON lines too, unless the file
    starts with ``[``, in which case it is one JSON array of records (no line numbers then).
    """
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DataFileError(describe_os_error(e, f"reading {path}")) from e
    if path.suffix.lower() == ".json" and data.lstrip().startswith(b"["):
        try:
            rows = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as e:  # one array: no rows yet, so the line (and column) is the place
            line_start = data.rfind(b"\n", 0, e.start) + 1
            lineno = data.count(b"\n", 0, e.start) + 1
            raise DataFileError(f"{path}, line {lineno}: {_not_utf8(e, e.start - line_start + 1)}") from None
        except json.JSONDecodeError as e:
            raise DataFileError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e
        for row in rows:
            yield None, row, None
        return
    # Split on "\n" only: str.splitlines would also split inside a string holding U+0085 or U+2028,
    # which json.dumps(ensure_ascii=False) writes raw. A "\r" before "\n" is JSON whitespace. The bytes are split
    # before decoding (0x0A is never inside a UTF-8 sequence) so that a bad byte is reported by row and line.
    for lineno, raw_line in enumerate(data.split(b"\n"), start=1):
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as e:
            yield lineno, None, _not_utf8(e, e.start + 1)
            continue
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line), None
        except json.JSONDecodeError as e:
            yield lineno, None, f"invalid JSON ({e.msg} at column {e.colno})"
        except RecursionError:  # a line of 100k "[": JSON, but nested deeper than Python parses
            yield lineno, None, "invalid JSON (nested too deeply)"


def read_raw_rows(path: str | Path) -> list[tuple[int, int | None, Any]]:
    """(row index, line number or None, row) of every record of a parquet or JSON file.

    Rows are not validated against any schema; a JSON line that does not parse raises a
    `DataValidationError` naming every such line.
    """
    p = _existing_file(path)
    if p.suffix.lower() in PARQUET_SUFFIXES:
        return [(i, None, row) for i, row in enumerate(read_parquet_rows(p))]
    rows: list[tuple[int, int | None, Any]] = []
    problems: list[DataProblem] = []
    for i, (lineno, row, error) in enumerate(iter_json_rows(p)):
        if error is not None:
            problems.append(DataProblem(str(p), i, "<line>", error, lineno))
        rows.append((i, lineno, row))
    if problems:
        raise DataValidationError(problems)
    return rows


def _records_and_problems(path: str | Path) -> tuple[list[DapoRecord], list[DataProblem]]:
    p = Path(path)
    try:
        raw = read_raw_rows(p)
    except DataValidationError as e:
        return [], e.problems
    if not raw:
        raise DataFileError(f"{p}: contains no records")
    keys = {k for _, _, row in raw if isinstance(row, dict) for k in row}
    if keys and not keys & {"prompt", "reward_model"}:
        message = (
            f"not in the DAPO schema: no 'prompt' or 'reward_model' in any row (columns: {sorted(keys)}); "
            "turn raw problem/answer files into DAPO data with `dapo data prepare`"
        )
        return [], [DataProblem(str(p), None, "prompt", message)]
    records: list[DapoRecord] = []
    problems: list[DataProblem] = []
    for row_index, lineno, row in raw:
        record, row_problems = check_row(row, source=str(p), row_index=row_index, line=lineno)
        if record is not None:
            records.append(record)
        problems.extend(row_problems)
    return records, problems


def load_records(path: str | Path) -> list[DapoRecord]:
    """Read and validate one DAPO-schema file (.parquet, .jsonl, or .json)."""
    records, problems = _records_and_problems(path)
    if problems:
        raise DataValidationError(problems)
    return records


def load_dataset(paths: str | Path | Sequence[str | Path]) -> list[DapoRecord]:
    """Read, validate and concatenate several DAPO-schema files, in the order given.

    The problems of all files are reported together in one `DataValidationError`.
    """
    path_list = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not path_list:
        raise DataFileError("no data files given")
    records: list[DapoRecord] = []
    problems: list[DataProblem] = []
    for path in path_list:
        file_records, file_problems = _records_and_problems(path)
        records.extend(file_records)
        problems.extend(file_problems)
    if problems:
        raise DataValidationError(problems)
    return records


def records_to_table(records: Sequence[DapoRecord]) -> pa.Table:
    """The records as an arrow table with the exact verl/DAPO nested schema."""
    columns: dict[str, pa.Array] = {
        "data_source": pa.array([r.data_source for r in records], pa.string()),
        "prompt": pa.array([r.messages() for r in records], pa.list_(MESSAGE_TYPE)),
        "ability": pa.array([r.ability for r in records], pa.string()),
        "reward_model": pa.array(
            [{"ground_truth": r.ground_truth, "style": r.style} for r in records], REWARD_MODEL_TYPE
        ),
    }
    if any(r.extra_info for r in records):
        try:
            columns["extra_info"] = pa.array([r.extra_info for r in records])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise DataFileError(
                f"field 'extra_info' cannot be stored as one parquet struct column "
                f"(a key holds values of different types across records?): {e}"
            ) from e
    return pa.table(columns)


def write_parquet(records: Iterable[DapoRecord], path: str | Path) -> Path:
    """Write records to a parquet file atomically (temp file + os.replace); return the path."""
    return write_parquet_files({Path(path): list(records)})[0]


def write_parquet_files(splits: Mapping[Path, Sequence[DapoRecord]]) -> list[Path]:
    """Write several parquet files together (a train and a val split): a failure at any of them (a full disk, an
    unwritable folder) leaves none of them changed and no temporary behind; the error names the file."""
    tables = {}
    for path, records in splits.items():
        if not records:
            raise DataFileError(f"{path}: refusing to write a data set with no records")
        tables[Path(path)] = records_to_table(records)
    current = next(iter(tables))

    def writer(path: Path, table: pa.Table) -> Callable[[Path], None]:
        def write(tmp: Path) -> None:
            nonlocal current
            current = path
            pq.write_table(table, str(tmp))

        return write

    try:
        atomic_write_files([(path, writer(path, table)) for path, table in tables.items()])
    except OSError as e:  # before ArrowException: arrow's I/O errors are OSErrors too
        raise DataFileError(describe_os_error(e, f"writing {current}")) from e
    except pa.ArrowException as e:
        raise DataFileError(f"{current}: cannot write parquet: {e}") from e
    return list(tables)


def write_jsonl(records: Iterable[DapoRecord], path: str | Path) -> Path:
    """Write records as JSON lines (UTF-8, one schema row per line) atomically; return the path."""
    lines = [json.dumps(r.to_row(), ensure_ascii=False) + "\n" for r in records]
    if not lines:
        raise DataFileError(f"{path}: refusing to write a data set with no records")
    p = Path(path)
    try:
        atomic_write(p, "".join(lines))
    except OSError as e:
        raise DataFileError(describe_os_error(e, f"writing {p}")) from e
    return p


def write_records(records: Iterable[DapoRecord], path: str | Path) -> Path:
    """Write records as parquet or JSON lines, chosen by the suffix of `path`; return the path."""
    suffix = Path(path).suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return write_parquet(records, path)
    if suffix in JSON_SUFFIXES:
        return write_jsonl(records, path)
    raise DataFileError(f"{path}: unsupported output type {suffix!r} (expected .parquet, .jsonl or .json)")
