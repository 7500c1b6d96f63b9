"""``dapo data``: prepare, synthesise and validate DAPO-schema data sets.

    dapo data prepare INPUT... --out DIR      raw problem/answer files -> train.parquet (+ val.parquet)
    dapo data synth --out FILE --num N        synthetic arithmetic problems (dapo.data.synth)
    dapo data validate FILE...                check files against the schema; exit code 1 on any problem

The ``synth`` difficulty options are generated from the fields of `SynthConfig`, so a knob added
there appears here without an edit: ``--min-operands 2``, ``--operations +,-,*``,
``--word-problems/--no-word-problems``. Fields of another type keep their default.
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from dapo.data.loaders import load_records, write_records
from dapo.data.prepare import ANSWER_FORMATS, prepare_dataset, strip_dapo_template
from dapo.data.schema import DapoRecord, DataError
from dapo.data.synth import SynthConfig, generate_synth_problems, synth_records


def _parse_tuple(item_type: type) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[Any, ...] | None:
        if value is None:
            return None
        try:
            return tuple(item_type(v.strip()) for v in value.split(",") if v.strip())
        except ValueError as e:
            raise click.BadParameter(f"expected comma-separated {item_type.__name__} values: {e}") from e

    return parse


def _synth_config_option(f: dataclasses.Field[Any], annotation: Any) -> Callable[[Any], Any] | None:
    """A click option for one SynthConfig field (None for a type the CLI cannot parse)."""
    flag = "--" + f.name.replace("_", "-")
    default = f.default
    help_text = f"SynthConfig.{f.name}" + (f" (default: {default!r})" if default is not dataclasses.MISSING else "")
    if annotation is bool:
        return click.option(f"{flag}/--no-{f.name.replace('_', '-')}", f.name, default=None, help=help_text)
    if annotation in (int, float, str):
        return click.option(flag, f.name, type=annotation, default=None, help=help_text)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in (int, float, str):
        shown = ",".join(str(v) for v in default) if isinstance(default, tuple) else default
        return click.option(
            flag,
            f.name,
            default=None,
            callback=_parse_tuple(args[0]),
            help=f"SynthConfig.{f.name}, comma-separated (default: {shown})",
        )
    return None


# Parameters of `dapo data synth` itself; a SynthConfig field of the same name is not exposed.
_SYNTH_COMMAND_PARAMS = frozenset({"out_path", "num", "seed", "val_size", "val_out", "data_source"})


def _synth_config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate `command` with one option per SynthConfig field of a type the CLI can parse."""
    hints = typing.get_type_hints(SynthConfig)
    for f in reversed(dataclasses.fields(SynthConfig)):
        if f.name in _SYNTH_COMMAND_PARAMS:
            continue
        option = _synth_config_option(f, hints[f.name])
        if option is not None:
            command = option(command)
    return command


def _fail(error: Exception) -> click.ClickException:
    return click.ClickException(str(error))


@click.group("data")
def data_group() -> None:
    """Prepare, synthesise and validate DAPO-schema data sets."""


@data_group.command("prepare")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="output folder for train.parquet (and val.parquet)",
)
@click.option(
    "--problem-key",
    default=None,
    help="column holding the problem [default: problem, or GSM8K's question in a file without one]",
)
@click.option("--answer-key", default="answer", show_default=True, help="column holding the answer")
@click.option(
    "--format",
    "answer_format",
    type=click.Choice(ANSWER_FORMATS),
    default="auto",
    show_default=True,
    help="answer format: gsm8k takes the text after '####'; auto does so when it is there",
)
@click.option("--data-source", default=None, help="data_source of every row (default: the row's own, or the file stem)")
@click.option("--no-template", is_flag=True, help="keep the raw problem instead of the DAPO prompt template")
@click.option("--no-dedup", is_flag=True, help="keep duplicate problems")
@click.option("--allow-non-integer", is_flag=True, help="keep answers that are not integers")
@click.option(
    "--val-size", type=click.IntRange(min=0), default=0, show_default=True, help="rows held out to val.parquet"
)
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the train/val split")
def prepare_command(
    inputs: tuple[Path, ...],
    out_dir: Path,
    problem_key: str | None,
    answer_key: str,
    answer_format: str,
    data_source: str | None,
    no_template: bool,
    no_dedup: bool,
    allow_non_integer: bool,
    val_size: int,
    seed: int,
) -> None:
    """Turn raw problem/answer files (parquet/JSONL) into DAPO-schema parquet."""
    try:
        summary = prepare_dataset(
            list(inputs),
            out_dir,
            problem_key=problem_key,
            answer_key=answer_key,
            answer_format=answer_format,  # type: ignore[arg-type]  # click.Choice guarantees the literal
            data_source=data_source,
            apply_template=not no_template,
            dedup=not no_dedup,
            integer_only=not allow_non_integer,
            val_size=val_size,
            seed=seed,
        )
    except (DataError, ValueError) as e:
        raise _fail(e) from e
    table = Table(title="dapo data prepare", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for label, value in summary.rows():
        table.add_row(label, value)
    Console().print(table)


def _write_synth(problems: list[Any], path: Path, *, data_source: str, split: str) -> int:
    rows = synth_records(problems, data_source=data_source, split=split)
    records = [DapoRecord.from_row(r, source=f"<synth {split}>", row_index=i) for i, r in enumerate(rows)]
    write_records(records, path)
    return len(records)


@data_group.command("synth")
@click.option(
    "--out",
    "out_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="output file (.parquet, or .jsonl)",
)
@click.option("--num", type=click.IntRange(min=1), required=True, help="number of training problems")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--val-size",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="validation problems, none of them also in the training set",
)
@click.option(
    "--val-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="validation output file (default: OUT with '.val' before the suffix)",
)
@click.option("--data-source", default="synth_arith", show_default=True)
@_synth_config_options
def synth_command(
    out_path: Path, num: int, seed: int, val_size: int, val_out: Path | None, data_source: str, **knobs: Any
) -> None:
    """Write a synthetic arithmetic data set (DAPO schema, templated prompts).

    The first NUM problems of the seeded stream are the training set (the same whatever
    --val-size is); the next VAL_SIZE, less any that repeat a training problem, are validation.
    """
    given = {name: value for name, value in knobs.items() if value is not None}
    try:
        config = dataclasses.replace(SynthConfig(), **given)
        problems = generate_synth_problems(num + val_size, seed, config)
        train = problems[:num]
        train_texts = {p.problem for p in train}
        val = [p for p in problems[num:] if p.problem not in train_texts]
        n_train = _write_synth(train, out_path, data_source=data_source, split="train")
        click.echo(f"wrote {n_train} training problems ({len(train_texts)} distinct) to {out_path}")
        if val_size:
            if not val:
                raise DataError(f"all {val_size} validation problems repeat training problems; raise max_value")
            val_path = val_out or out_path.with_name(f"{out_path.stem}.val{out_path.suffix}")
            n_val = _write_synth(val, val_path, data_source=data_source, split="val")
            click.echo(
                f"wrote {n_val} validation problems to {val_path} "
                f"({val_size - n_val} dropped: same as a training problem)"
            )
    except (DataError, ValueError, TypeError) as e:
        raise _fail(e) from e


@data_group.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
def validate_command(files: tuple[Path, ...]) -> None:
    """Check files against the DAPO schema: OK and counts, or every problem (exit code 1)."""
    errors: list[str] = []
    for path in files:
        try:
            records = load_records(path)
        except DataError as e:  # DataValidationError lists every bad row; DataFileError the file
            errors.append(str(e))
            continue
        sources = Counter(r.data_source for r in records)
        raw = sum(1 for r in records if strip_dapo_template(r.prompt[-1].content) == r.prompt[-1].content)
        by_source = ", ".join(f"{name}: {n}" for name, n in sources.most_common())
        click.echo(f"OK {path}: {len(records)} records ({by_source})")
        if raw:
            click.echo(f"   note: {raw} prompts are not in the DAPO template; `dapo data prepare` adds it")
    if errors:
        raise click.ClickException("\n".join(errors))


if __name__ == "__main__":
    data_group()
