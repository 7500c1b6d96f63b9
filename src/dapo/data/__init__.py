"""Data sets in the verl/DAPO schema: validation, loading/writing, and preparation from raw files."""

from dapo.data.loaders import load_dataset, load_records, write_jsonl, write_parquet, write_records
from dapo.data.prepare import PrepareSummary, parse_integer_answer, prepare_dataset
from dapo.data.schema import (
    DapoRecord,
    DataError,
    DataFileError,
    DataProblem,
    DataValidationError,
    Message,
)
from dapo.data.template import DAPO_PROMPT_TEMPLATE, apply_dapo_template

__all__ = [
    "DAPO_PROMPT_TEMPLATE",
    "DapoRecord",
    "DataError",
    "DataFileError",
    "DataProblem",
    "DataValidationError",
    "Message",
    "PrepareSummary",
    "apply_dapo_template",
    "load_dataset",
    "load_records",
    "parse_integer_answer",
    "prepare_dataset",
    "write_jsonl",
    "write_parquet",
    "write_records",
]
