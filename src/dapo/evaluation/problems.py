"""Evaluation problems: read a test file through the data layer and group its rows by problem identity.

Accepted files (``--test-file``):

* DAPO/verl-schema parquet or JSONL (``prompt`` + ``reward_model``), e.g. the official ``aime-2024.parquet``: prompts
  are used exactly as they are (the AIME file already carries the DAPO template);
* raw problem/answer files (``problem``/``answer`` as AIME 2025 and MATH-500, ``question``/``answer`` with the final
  answer after ``#### `` as GSM8K): converted by :func:`dapo.data.prepare.prepare_dataset` (no de-duplication, any
  answer kept, not only integers), with ``data_source`` the file's stem (``math500`` -> math-verify,
  ``gsm8k-test`` -> the GSM8K scorer, ``aime-2025`` -> the DAPO scorer) and, with ``template="dapo"`` (the default),
  the DAPO prompt template around the problem so that the model is asked for an ``Answer:`` line;
* ``synth``: the synthetic arithmetic validation set that ``dapo train`` validates on (``DataConfig().synth``, or the
  ``data`` section of a training config: ``dapo eval --synth-config``).

Rows with the same content (data_source, prompt messages, ground truth) are one problem: its ``repeats`` count becomes
extra samples (see :mod:`dapo.evaluation.metrics`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo.config import DataConfig
from dapo.data.loaders import load_dataset, read_raw_rows
from dapo.data.prepare import prepare_dataset
from dapo.data.schema import DapoRecord, DataFileError
from dapo.data.task import synth_split

SYNTH_NAME = "synth"
TEMPLATES: tuple[str, ...] = ("dapo", "raw")


@dataclass(frozen=True)
class EvalProblem:
    """One distinct problem of a test file."""

    key: str  # content hash: stable across runs, files and row order
    problem_id: str  # human-readable: extra_info.index when the file has it, else the first row number
    data_source: str
    messages: tuple[dict[str, str], ...]
    ground_truth: str
    repeats: int = 1
    extra_info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def prompt_text(self) -> str:
        """The last user message (what the published example prints as the question)."""
        return self.messages[-1]["content"] if self.messages else ""


def problem_key(record: DapoRecord) -> str:
    """A problem's identity: a hash of its data_source, prompt messages and ground truth."""
    blob = json.dumps([record.data_source, record.messages(), record.ground_truth], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def group_records(records: Sequence[DapoRecord]) -> list[EvalProblem]:
    """Distinct problems in order of first appearance, each with how many rows repeat it."""
    order: list[str] = []
    first: dict[str, tuple[int, DapoRecord]] = {}
    repeats: dict[str, int] = {}
    for row, record in enumerate(records):
        key = problem_key(record)
        if key not in first:
            first[key] = (row, record)
            order.append(key)
        repeats[key] = repeats.get(key, 0) + 1
    problems = []
    for key in order:
        row, record = first[key]
        index = record.extra_info.get("index")
        problem_id = str(index) if isinstance(index, (int, str)) and not isinstance(index, bool) else str(row)
        problems.append(
            EvalProblem(
                key,
                problem_id,
                record.data_source,
                tuple(record.messages()),
                record.ground_truth,
                repeats[key],
                dict(record.extra_info),
            )
        )
    return problems


def synth_validation_records(data: DataConfig | None = None) -> list[DapoRecord]:
    """The synthetic validation set ``dapo train`` reports accuracy on, for ``data`` (default: the default config)."""
    return synth_split(data or DataConfig(), "val")


def _raw_keys(path: Path) -> set[str]:
    keys: set[str] = set()
    for _, _, row in read_raw_rows(path):
        if isinstance(row, dict):
            keys.update(map(str, row))
    return keys


def load_test_records(path: str | Path, *, template: str = "dapo", synth: DataConfig | None = None) -> list[DapoRecord]:
    """The rows of one test file as DAPO records (see the module docstring for the accepted shapes); ``synth`` is the
    data config whose held-out set ``synth`` names."""
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")
    if str(path) == SYNTH_NAME:
        return synth_validation_records(synth)
    p = Path(path)
    keys = _raw_keys(p)
    if {"prompt", "reward_model"} <= keys or not keys & {"problem", "question"}:
        return load_dataset(p)
    problem_column = "problem" if "problem" in keys else "question"
    with tempfile.TemporaryDirectory(prefix="dapo-eval-") as tmp:
        prepare_dataset(
            p,
            tmp,
            problem_key=problem_column,
            answer_key="answer",
            answer_format="auto",
            apply_template=template == "dapo",
            dedup=False,
            integer_only=False,
        )
        records = load_dataset(Path(tmp) / "train.parquet")
    return records


def load_problems(
    paths: Sequence[str | Path],
    *,
    template: str = "dapo",
    max_problems: int | None = None,
    synth: DataConfig | None = None,
) -> list[EvalProblem]:
    """Distinct problems of all test files, in file order; ``max_problems`` keeps the first ones."""
    if not paths:
        raise DataFileError("no test file given")
    records: list[DapoRecord] = []
    for path in paths:
        records += load_test_records(path, template=template, synth=synth)
    problems = group_records(records)
    if max_problems is not None:
        problems = problems[:max_problems]
    return problems
