"""The training task: prompts for training and validation, from DAPO-schema files or the built-in synthetic task."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from dapo.config import DataConfig
from dapo.data.big_arith import BigArithConfig, big_arith_records, generate_big_arith_problems
from dapo.data.loaders import load_dataset
from dapo.data.schema import DapoRecord, DataError
from dapo.data.synth import default_synth_config, distinct_synth_problems, generate_synth_problems, synth_records
from dapo.data.prompts import PromptItem, encode_prompts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    train: list[PromptItem]
    val: list[PromptItem]
    description: str
    num_dropped_too_long: int


def synth_split(cfg: DataConfig, split: str) -> list[DapoRecord]:
    """The built-in task's ``train`` or ``val`` records as ``cfg.synth`` sets them (``dapo eval --test-file synth``
    reads the same ``val`` set the trainer validates on)."""
    if cfg.synth.task == "big_arith":
        return big_arith_split(cfg, split)
    knobs = {
        k: v
        for k in ("min_operands", "max_operands", "max_value", "word_problems")
        if (v := getattr(cfg.synth, k)) is not None
    }
    if cfg.synth.operations is not None:
        knobs["operations"] = tuple(cfg.synth.operations)
    synth_cfg = dataclasses.replace(default_synth_config(), **knobs)
    if split == "train":
        problems = generate_synth_problems(cfg.synth.num_train, cfg.synth.train_seed, synth_cfg)
    else:  # held-out problems are distinct: a repeat would weigh one problem twice in the accuracy
        try:
            problems = distinct_synth_problems(cfg.synth.num_val, cfg.synth.val_seed, synth_cfg)
        except ValueError as exc:
            raise DataError(f"data.synth.num_val={cfg.synth.num_val}: {exc}") from None
    rows = synth_records(problems, split=split)
    return [DapoRecord.from_row(row, source=f"<synth {split}>", row_index=i) for i, row in enumerate(rows)]


def big_arith_split(cfg: DataConfig, split: str) -> list[DapoRecord]:
    """The tool task's records (``data.synth.task=big_arith``): the problem spaces are large, so the two seeded
    streams practically never share a problem (read_task removes any that do from the training set)."""
    knobs = cfg.synth.big_arith
    try:
        config = BigArithConfig(
            kind=knobs.kind, min_digits=knobs.min_digits, max_digits=knobs.max_digits, operands=knobs.operands
        )
    except ValueError as exc:
        raise DataError(f"data.synth.big_arith: {exc}") from None
    num, seed = (
        (cfg.synth.num_train, cfg.synth.train_seed) if split == "train" else (cfg.synth.num_val, cfg.synth.val_seed)
    )
    rows = big_arith_records(generate_big_arith_problems(num, seed, config), split=split)
    return [DapoRecord.from_row(row, source=f"<big_arith {split}>", row_index=i) for i, row in enumerate(rows)]


@dataclass(frozen=True)
class TaskRecords:
    """The validated records of a task, before tokenisation: everything that can be checked without a tokenizer."""

    train: list[DapoRecord]
    val: list[DapoRecord]
    description: str


def read_task(cfg: DataConfig) -> TaskRecords:
    """Read and validate every record (all problems reported at once). Needs no model, so a run checks its data files
    before it spends seconds loading one."""
    val_records = load_dataset(cfg.val_files) if cfg.val_files else []
    if cfg.train_files:
        train_records = load_dataset(cfg.train_files)
        description = ", ".join(cfg.train_files)
    else:
        # Held-out problems are drawn first and never trained on: two seeded streams can draw the same small problem.
        if not cfg.val_files:
            val_records = synth_split(cfg, "val")
        held_out = {r.extra_info.get("raw_problem") for r in val_records}
        train_records = [r for r in synth_split(cfg, "train") if r.extra_info.get("raw_problem") not in held_out]
        removed = cfg.synth.num_train - len(train_records)
        name = "synthetic tool arithmetic" if cfg.synth.task == "big_arith" else "synthetic arithmetic"
        description = (
            f"{name} ({len(train_records)} problems, seed {cfg.synth.train_seed}, after "
            f"removing {removed} that are validation problems)"
        )
    if cfg.val_max_samples is not None:
        val_records = val_records[: cfg.val_max_samples]
    return TaskRecords(train_records, val_records, description)


def encode_task(records: TaskRecords, cfg: DataConfig, tokenizer) -> Task:
    """Tokenise with the chat template and apply the prompt-length rule (the checks that need the tokenizer)."""
    train_records, val_records = records.train, records.val
    train = encode_prompts(
        train_records,
        tokenizer,
        max_prompt_length=cfg.max_prompt_length,
        too_long=cfg.filter_overlong_prompts,
        where="data.train_files",
    )
    val = encode_prompts(
        val_records,
        tokenizer,
        max_prompt_length=cfg.max_prompt_length,
        too_long=cfg.filter_overlong_prompts,
        where="data.val_files",
    )
    dropped = train.num_dropped_too_long + val.num_dropped_too_long
    if dropped:
        log.warning(
            "dropped %d prompts longer than data.max_prompt_length=%d (longest: %d tokens)",
            dropped,
            cfg.max_prompt_length,
            max(train.longest_dropped, val.longest_dropped),
        )
    if not train.items:
        why = (
            f"all {len(train_records)} are longer than data.max_prompt_length={cfg.max_prompt_length}"
            if train_records
            else "every synthetic problem is also a validation problem; raise data.synth.max_value"
        )
        raise DataError(f"no training prompts left: {why}")
    if not val.items:
        log.warning("no validation prompts: validation accuracy will not be measured (set data.val_files)")
    return Task(train.items, val.items, records.description, dropped)


def load_task(cfg: DataConfig, tokenizer) -> Task:
    """Read and validate every record, then tokenise with the chat template: `read_task`, then `encode_task`."""
    return encode_task(read_task(cfg), cfg, tokenizer)
