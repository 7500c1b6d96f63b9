"""Turn raw math problem/answer files into a DAPO-schema training set (and validation set).

Inputs (parquet, .jsonl or .json) come in one of two shapes, decided per file:

  * raw rows with a problem column and an answer column (names configurable: ``problem_key``,
    ``answer_key``), e.g. MATH-500 or GSM8K (``question``/``answer``, the answer ending in
    ``#### N``);
  * rows already in the DAPO schema (``prompt`` + ``reward_model``, no problem column), e.g.
    DAPO-Math-17k: the problem is ``prompt[-1].content`` (with the DAPO template stripped if it
    is there, as in the AIME 2024 file) and the answer ``reward_model.ground_truth``.

Pipeline, with every dropped row counted by reason:
  1. extract problem and answer; drop missing/empty/non-text ones;
  2. answer format: ``gsm8k`` takes the text after the last ``####`` (rows without it are
     dropped), ``plain`` takes the answer as is, ``auto`` does the former when ``####`` is there;
  3. integers are normalised to their canonical form (``"1,234"`` -> ``"1234"``, ``"007"`` ->
     ``"7"``, ``"+5"`` -> ``"5"``); with ``integer_only`` any other answer (``"3/4"``,
     ``"\\sqrt2"``, ``"2.5"``) is dropped, since DAPO's rule-based reward compares integers;
  4. de-duplication of identical problems (whitespace-normalised), keeping the first;
  5. a seeded train/validation split (each split keeps the input order);
  6. the DAPO template (``dapo.data.template``) around each problem; atomic parquet writes.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dapo.data.loaders import read_raw_rows, write_parquet_files
from dapo.data.schema import DEFAULT_ABILITY, DEFAULT_STYLE, DapoRecord, DataFileError, Message
from dapo.data.template import DAPO_PROMPT_TEMPLATE, apply_dapo_template

AnswerFormat = Literal["auto", "plain", "gsm8k"]
ANSWER_FORMATS: tuple[str, ...] = ("auto", "plain", "gsm8k")

DROP_NOT_OBJECT = "row is not an object"
DROP_MISSING_PROBLEM = "missing problem"
DROP_EMPTY_PROBLEM = "empty problem"
DROP_BAD_PROBLEM = "problem is not text"
DROP_BAD_PROMPT = "malformed DAPO prompt"
DROP_MISSING_ANSWER = "missing answer"
DROP_EMPTY_ANSWER = "empty answer"
DROP_BAD_ANSWER = "answer is not text or number"
DROP_NO_GSM8K_MARKER = "no '####' in answer"
DROP_NON_INTEGER = "non-integer answer"

_INTEGER = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)")
_TEMPLATE_PREFIX, _TEMPLATE_SUFFIX = DAPO_PROMPT_TEMPLATE.split("{problem}")


def parse_integer_answer(text: str) -> str | None:
    """The canonical integer string of an integer answer, or None if it is not one.

    Accepts an optional sign, leading zeros and correctly placed thousands commas:
    ``"1,234"`` -> ``"1234"``, ``"-5"`` -> ``"-5"``, ``"007"`` -> ``"7"``, ``"-0"`` -> ``"0"``.
    """
    text = text.strip()
    if not _INTEGER.fullmatch(text):
        return None
    return str(int(text.replace(",", "")))


def extract_gsm8k_answer(text: str) -> str | None:
    """The final answer of a GSM8K solution (the text after the last ``####``), or None."""
    if "####" not in text:
        return None
    return text.rpartition("####")[2].strip()


def strip_dapo_template(text: str) -> str:
    """The raw problem inside a DAPO-templated prompt; other text is returned unchanged."""
    if text.startswith(_TEMPLATE_PREFIX) and text.endswith(_TEMPLATE_SUFFIX):
        return text[len(_TEMPLATE_PREFIX) : len(text) - len(_TEMPLATE_SUFFIX)].strip()
    return text


@dataclass(frozen=True)
class _Example:
    """One usable problem/answer pair and where it came from."""

    problem: str
    answer: str
    data_source: str
    source_file: str
    source_row: int


@dataclass
class PrepareSummary:
    """What `prepare_dataset` read, dropped (per reason), de-duplicated, kept and wrote."""

    inputs: list[str]
    rows_read: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    first_dropped: dict[str, str] = field(default_factory=dict)  # reason -> "file row N"
    duplicates: int = 0
    conflicting_duplicates: int = 0  # duplicates whose answer differs from the kept copy's
    kept: int = 0
    train_size: int = 0
    val_size: int = 0
    train_path: Path | None = None
    val_path: Path | None = None

    def drop(self, reason: str, source_file: str, row: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        self.first_dropped.setdefault(reason, f"{source_file} row {row}")

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines of the summary, for `format` and for a rich table."""
        out = [("inputs", ", ".join(self.inputs)), ("rows read", str(self.rows_read))]
        for reason, count in sorted(self.dropped.items(), key=lambda kv: -kv[1]):
            out.append((f"dropped: {reason}", f"{count} (first: {self.first_dropped[reason]})"))
        out += [
            ("duplicates removed", f"{self.duplicates} ({self.conflicting_duplicates} with a different answer)"),
            ("kept", str(self.kept)),
        ]
        if self.train_path is not None:
            out.append(("train", f"{self.train_size} -> {self.train_path}"))
        if self.val_path is not None:
            out.append(("val", f"{self.val_size} -> {self.val_path}"))
        return out

    def format(self) -> str:
        width = max(len(label) for label, _ in self.rows())
        return "\n".join(f"{label:<{width}}  {value}" for label, value in self.rows())


def _answer_text(value: Any) -> str | None:
    """An answer cell as text (numbers stringified like ground truths), or None if unusable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, str):
        return value
    return None


def _default_problem_key(rows: list[tuple[int, int | None, Any]]) -> str:
    """The problem column when none is named: 'problem' (MATH-500), else GSM8K's 'question' when a row has one."""
    keys: set[str] = set()
    for _, _, row in rows:
        if isinstance(row, Mapping):
            keys.update(str(k) for k in row)
    return "question" if "problem" not in keys and "question" in keys else "problem"


def _file_kind(path: Path, rows: list[tuple[int, int | None, Any]], problem_key: str, answer_key: str) -> str:
    """'raw' or 'dapo' for a file, from the union of its rows' keys; a clear error otherwise."""
    keys: set[str] = set()
    for _, _, row in rows:
        if isinstance(row, Mapping):
            keys.update(str(k) for k in row)
    if problem_key in keys:
        if answer_key not in keys:
            raise DataFileError(
                f"{path}: no answer column {answer_key!r} (columns: {sorted(keys)}); "
                "choose one with answer_key (--answer-key)"
            )
        return "raw"
    if {"prompt", "reward_model"} <= keys:
        return "dapo"
    raise DataFileError(
        f"{path}: no problem column {problem_key!r} and not in the DAPO schema (columns: {sorted(keys)}); "
        "choose the problem and answer columns with problem_key / answer_key (--problem-key / --answer-key)"
    )


def _cells(row: Any, kind: str, problem_key: str, answer_key: str) -> tuple[Any, Any, str | None, str | None]:
    """(problem cell, answer cell, the row's own data_source, drop reason or None) of one row."""
    if not isinstance(row, Mapping):
        return None, None, None, DROP_NOT_OBJECT
    if kind == "raw":
        return row.get(problem_key), row.get(answer_key), None, None
    prompt = row.get("prompt")
    if not isinstance(prompt, (list, tuple)) or not prompt or not isinstance(prompt[-1], Mapping):
        return None, None, None, DROP_BAD_PROMPT
    problem = prompt[-1].get("content")
    if isinstance(problem, str):
        problem = strip_dapo_template(problem)
    reward_model = row.get("reward_model")
    answer = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    source = row.get("data_source")
    return problem, answer, (source if isinstance(source, str) and source.strip() else None), None


def _problem(cell: Any) -> tuple[str | None, str | None]:
    """(stripped problem text, None) or (None, drop reason)."""
    if cell is None:
        return None, DROP_MISSING_PROBLEM
    if not isinstance(cell, str):
        return None, DROP_BAD_PROBLEM
    if not cell.strip():
        return None, DROP_EMPTY_PROBLEM
    return cell.strip(), None


def _answer(cell: Any, answer_format: str, integer_only: bool) -> tuple[str | None, str | None]:
    """(normalised answer, None) or (None, drop reason); see the module docstring, steps 2-3."""
    if cell is None:
        return None, DROP_MISSING_ANSWER
    text = _answer_text(cell)
    if text is None:
        return None, DROP_BAD_ANSWER
    if answer_format == "gsm8k" or (answer_format == "auto" and "####" in text):
        text = extract_gsm8k_answer(text)
        if text is None:
            return None, DROP_NO_GSM8K_MARKER
    text = text.strip()
    if not text:
        return None, DROP_EMPTY_ANSWER
    integer = parse_integer_answer(text)
    if integer is not None:
        return integer, None
    if integer_only:
        return None, DROP_NON_INTEGER
    return text, None


def _extract(
    path: Path,
    summary: PrepareSummary,
    *,
    problem_key: str | None,
    answer_key: str,
    answer_format: str,
    integer_only: bool,
    data_source: str | None,
) -> list[_Example]:
    """The usable examples of one input file; every dropped row is counted in `summary`."""
    rows = read_raw_rows(path)
    summary.rows_read += len(rows)
    problem_key = problem_key or _default_problem_key(rows)
    kind = _file_kind(path, rows, problem_key, answer_key) if rows else "raw"
    examples = []
    for row_index, _, row in rows:
        problem_cell, answer_cell, own_source, reason = _cells(row, kind, problem_key, answer_key)
        problem = answer = None
        if reason is None:
            problem, reason = _problem(problem_cell)
        if reason is None:
            answer, reason = _answer(answer_cell, answer_format, integer_only)
        if reason is not None or problem is None or answer is None:
            summary.drop(reason or DROP_MISSING_ANSWER, path.name, row_index)
            continue
        examples.append(
            _Example(
                problem=problem,
                answer=answer,
                data_source=data_source or own_source or path.stem,
                source_file=path.name,
                source_row=row_index,
            )
        )
    return examples


def _check_split_args(val_size: int, val_fraction: float) -> None:
    if val_size < 0:
        raise ValueError(f"val_size must be >= 0, got {val_size}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if val_size and val_fraction:
        raise ValueError("give val_size or val_fraction, not both")


def _val_count(kept: int, val_size: int, val_fraction: float) -> int:
    n_val = val_size or round(val_fraction * kept)
    if n_val >= kept:
        raise DataFileError(f"validation size {n_val} leaves no training rows ({kept} rows kept)")
    return n_val


def prepare_dataset(
    inputs: str | Path | Sequence[str | Path],
    output_dir: str | Path,
    *,
    problem_key: str | None = None,
    answer_key: str = "answer",
    answer_format: AnswerFormat = "auto",
    data_source: str | None = None,
    apply_template: bool = True,
    dedup: bool = True,
    integer_only: bool = True,
    val_size: int = 0,
    val_fraction: float = 0.0,
    seed: int = 0,
) -> PrepareSummary:
    """Build ``output_dir/train.parquet`` (and ``val.parquet`` when a validation size is given).

    `data_source` overrides every row's; when None, DAPO-schema rows keep their own and raw rows
    get the input file's stem (``gsm8k-train.jsonl`` -> ``"gsm8k-train"``). Each record's
    ``extra_info`` holds ``index`` (position among the kept problems), ``split``,
    ``raw_problem``, ``source_file`` and ``source_row`` (0-based row in that file). `problem_key` None: each
    file's 'problem' column, or GSM8K's 'question' in a file without one.
    """
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    if data_source is not None and not data_source.strip():
        raise ValueError("data_source must not be empty")
    _check_split_args(val_size, val_fraction)
    paths = [Path(inputs)] if isinstance(inputs, (str, Path)) else [Path(p) for p in inputs]
    if not paths:
        raise DataFileError("no input files given")
    summary = PrepareSummary(inputs=[str(p) for p in paths])

    examples: list[_Example] = []
    for path in paths:
        examples += _extract(
            path,
            summary,
            problem_key=problem_key,
            answer_key=answer_key,
            answer_format=answer_format,
            integer_only=integer_only,
            data_source=data_source,
        )

    if dedup:
        first_answer: dict[str, str] = {}
        unique = []
        for ex in examples:
            key = " ".join(ex.problem.split())
            if key not in first_answer:
                first_answer[key] = ex.answer
                unique.append(ex)
            elif first_answer[key] != ex.answer:
                summary.conflicting_duplicates += 1
        summary.duplicates = len(examples) - len(unique)
        examples = unique
    summary.kept = len(examples)
    if not examples:
        raise DataFileError(f"no usable rows in {', '.join(summary.inputs)}:\n{summary.format()}")

    n_val = _val_count(len(examples), val_size, val_fraction)
    val_indices = set(random.Random(seed).sample(range(len(examples)), n_val))
    splits: dict[str, list[DapoRecord]] = {"train": [], "val": []}
    for index, ex in enumerate(examples):
        split = "val" if index in val_indices else "train"
        text = apply_dapo_template(ex.problem) if apply_template else ex.problem
        splits[split].append(
            DapoRecord(
                data_source=ex.data_source,
                prompt=(Message(role="user", content=text),),
                ability=DEFAULT_ABILITY,
                ground_truth=ex.answer,
                style=DEFAULT_STYLE,
                extra_info={
                    "index": index,
                    "split": split,
                    "raw_problem": ex.problem,
                    "source_file": ex.source_file,
                    "source_row": ex.source_row,
                },
            )
        )

    out = Path(output_dir)
    summary.train_size = len(splits["train"])
    files = {out / "train.parquet": splits["train"]}
    if splits["val"]:
        summary.val_size = len(splits["val"])
        files[out / "val.parquet"] = splits["val"]
    # Both splits or neither: a val.parquet that fails to write must not leave a new train.parquet beside an old val.
    written = write_parquet_files(files)
    summary.train_path = written[0]
    summary.val_path = written[1] if len(written) > 1 else None
    return summary
