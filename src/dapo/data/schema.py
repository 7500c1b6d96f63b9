"""The verl/DAPO data schema: one `DapoRecord` per prompt, and the validation that guards it.

A row of a DAPO data set (parquet or JSON lines) looks like::

    {"data_source": "math_dapo",
     "prompt": [{"role": "user", "content": "Solve the following math problem ..."}],
     "ability": "math",
     "reward_model": {"ground_truth": "34", "style": "rule"},
     "extra_info": {"index": 0, ...}}          # free-form, kept as is

This is the layout verl's RLHFDataset and the DAPO release (DAPO-Math-17k, AIME 2024) use.

Validation reports every problem of every row (file, row, field, what is wrong) in one
`DataValidationError`, so that a bad data set stops before training starts instead of failing
with a traceback deep inside a rollout.

Lenient on purpose (documented, tested):
  * a ground truth written as a JSON number is accepted and stringified: ints as ``str(n)``,
    integral floats as the integer (``3.0`` -> ``"3"``), other finite floats as ``str(x)``;
    booleans, NaN and infinities are rejected. Ground truths are stripped of surrounding spaces;
  * ``ability`` defaults to ``"math"``, ``reward_model.style`` to ``"rule"`` and ``extra_info``
    to ``{}`` when absent (or null); when present they must have the right type;
  * keys a row has beyond the five schema fields (e.g. pandas' ``__index_level_0__``) and keys
    of a message beyond ``role``/``content`` are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})
DEFAULT_ABILITY = "math"
DEFAULT_STYLE = "rule"
MAX_PROBLEMS_SHOWN = 20

Report = Callable[[str, str], None]  # report(field, message): record one problem of the row being checked


class DataError(ValueError):
    """Base class of every data-layer error: the message alone tells the user what to fix."""


class DataFileError(DataError):
    """A data file cannot be used at all: missing, unsupported suffix, unreadable, empty."""


@dataclass(frozen=True)
class DataProblem:
    """One thing wrong with one record: where it is (file, row, field) and what is wrong."""

    source: str
    row: int | None  # 0-based record index within the file; None for a file-level problem
    field: str
    message: str
    line: int | None = None  # 1-based line number, for JSON lines files

    def __str__(self) -> str:
        return f"{place(self.source, self.row, self.line)}, field '{self.field}': {self.message}"


def place(source: str, row: int | None, line: int | None = None) -> str:
    """``"train.jsonl, row 3 (line 4)"``: how every message names a row."""
    where = source
    if row is not None:
        where += f", row {row}"
    if line is not None:
        where += f" (line {line})"
    return where


class DataValidationError(DataError):
    """Every problem found in one or more data files, raised once, before training starts.

    The message lists the first `MAX_PROBLEMS_SHOWN` problems and counts the rest; the full
    list is in `.problems`.
    """

    def __init__(self, problems: Sequence[DataProblem]) -> None:
        if not problems:
            raise ValueError("DataValidationError needs at least one problem")
        self.problems: list[DataProblem] = list(problems)
        super().__init__(self._format())

    def _format(self) -> str:
        n = len(self.problems)
        sources = sorted({p.source for p in self.problems})
        head = f"{n} problem{'s' if n != 1 else ''} in {', '.join(sources)}:"
        lines = [head] + [f"  - {p}" for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        if n > MAX_PROBLEMS_SHOWN:
            lines.append(f"  ... and {n - MAX_PROBLEMS_SHOWN} more problems")
        return "\n".join(lines)


@dataclass(frozen=True)
class Message:
    """One chat message of a prompt."""

    role: str
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class DapoRecord:
    """One prompt of a DAPO data set, validated (see the module docstring for the rules)."""

    data_source: str
    prompt: tuple[Message, ...]
    ability: str
    ground_truth: str
    style: str = DEFAULT_STYLE
    extra_info: dict[str, Any] = field(default_factory=dict)
    # Where the row was read ("train.jsonl, row 3 (line 4)"), for messages about it that come later (a prompt too
    # long for the tokenizer); not part of the data, so not compared and not written.
    origin: str | None = field(default=None, compare=False, repr=False)

    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages, ready for a tokenizer's ``apply_chat_template``."""
        return [m.to_dict() for m in self.prompt]

    def to_row(self) -> dict[str, Any]:
        """The record as a verl/DAPO schema row (plain dicts and lists)."""
        return {
            "data_source": self.data_source,
            "prompt": self.messages(),
            "ability": self.ability,
            "reward_model": {"ground_truth": self.ground_truth, "style": self.style},
            "extra_info": dict(self.extra_info),
        }

    @classmethod
    def from_row(cls, row: Any, *, source: str, row_index: int, line: int | None = None) -> DapoRecord:
        """Validate a schema row; raise `DataValidationError` listing all of its problems."""
        record, problems = check_row(row, source=source, row_index=row_index, line=line)
        if problems:
            raise DataValidationError(problems)
        assert record is not None
        return record


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _ground_truth_text(value: Any) -> tuple[str | None, str | None]:
    """(ground truth as text, None) or (None, what is wrong)."""
    if value is None:
        return None, "missing"
    if isinstance(value, bool):
        return None, f"expected a string or number, got bool ({value})"
    if isinstance(value, int):
        return str(value), None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None, f"expected a finite number, got {value}"
        return (str(int(value)) if value.is_integer() else str(value)), None
    if isinstance(value, str):
        if not value.strip():
            return None, "empty"
        return value.strip(), None
    return None, f"expected a string or number, got {_type_name(value)}"


def _check_messages(prompt: Any, report: Report) -> tuple[Message, ...]:
    if prompt is None:
        report("prompt", "missing")
        return ()
    if not isinstance(prompt, (list, tuple)):
        report("prompt", f"expected a list of messages, got {_type_name(prompt)}")
        return ()
    if not prompt:
        report("prompt", "empty message list")
        return ()
    messages = []
    for i, msg in enumerate(prompt):
        where = f"prompt[{i}]"
        if not isinstance(msg, Mapping):
            report(where, f"expected a message {{'role', 'content'}}, got {_type_name(msg)}")
            continue
        role, content = msg.get("role"), msg.get("content")
        ok = True
        if role is None:
            report(f"{where}.role", "missing")
            ok = False
        elif not isinstance(role, str):
            report(f"{where}.role", f"expected a string, got {_type_name(role)}")
            ok = False
        elif role not in ROLES:
            report(f"{where}.role", f"unknown role {role!r} (expected one of {sorted(ROLES)})")
            ok = False
        if content is None:
            report(f"{where}.content", "missing")
            ok = False
        elif not isinstance(content, str):
            report(f"{where}.content", f"expected a string, got {_type_name(content)}")
            ok = False
        elif not content.strip():
            report(f"{where}.content", "empty text")
            ok = False
        if ok:
            messages.append(Message(role=role, content=content))
    return tuple(messages)


def _optional_str(row: Mapping[str, Any], key: str, default: str, report: Report, where: str) -> str:
    value = row.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        report(where, f"expected a string, got {_type_name(value)}")
        return default
    return value


def check_row(
    row: Any, *, source: str, row_index: int, line: int | None = None
) -> tuple[DapoRecord | None, list[DataProblem]]:
    """Validate one schema row: (record, []) when valid, else (None, every problem found)."""
    problems: list[DataProblem] = []

    def report(field_name: str, message: str) -> None:
        problems.append(DataProblem(source, row_index, field_name, message, line))

    if not isinstance(row, Mapping):
        report("<row>", f"expected an object with the DAPO schema fields, got {_type_name(row)}")
        return None, problems

    data_source = row.get("data_source")
    if data_source is None:
        report("data_source", "missing")
    elif not isinstance(data_source, str):
        report("data_source", f"expected a string, got {_type_name(data_source)}")
    elif not data_source.strip():
        report("data_source", "empty")

    messages = _check_messages(row.get("prompt"), report)
    ability = _optional_str(row, "ability", DEFAULT_ABILITY, report, "ability")

    ground_truth: str | None = None
    style = DEFAULT_STYLE
    reward_model = row.get("reward_model")
    if reward_model is None:
        report("reward_model.ground_truth", "missing (no 'reward_model' field)")
    elif not isinstance(reward_model, Mapping):
        report("reward_model", f"expected an object {{'ground_truth', 'style'}}, got {_type_name(reward_model)}")
    else:
        ground_truth, error = _ground_truth_text(reward_model.get("ground_truth"))
        if error is not None:
            report("reward_model.ground_truth", error)
        style = _optional_str(reward_model, "style", DEFAULT_STYLE, report, "reward_model.style")

    extra_info = row.get("extra_info")
    if extra_info is None:
        extra_info = {}
    elif not isinstance(extra_info, Mapping):
        report("extra_info", f"expected an object, got {_type_name(extra_info)}")
    elif not all(isinstance(k, str) for k in extra_info):
        report("extra_info", "keys must be strings")

    if problems:
        return None, problems
    assert isinstance(data_source, str) and ground_truth is not None and isinstance(extra_info, Mapping)
    record = DapoRecord(
        data_source=data_source,
        prompt=messages,
        ability=ability,
        ground_truth=ground_truth,
        style=style,
        extra_info=dict(extra_info),
        origin=place(source, row_index, line),
    )
    return record, problems
