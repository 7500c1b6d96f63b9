"""``dapo eval``: avg@K / pass@k / maj@K of a model on a benchmark, with a local engine or an OpenAI-compatible server.

    dapo eval --test-file ../shared/data/aime-2024.parquet --max-tokens 20480        # the published AIME avg@32
    dapo eval --model runs/x/checkpoints/global_step_30/hf --test-file synth --n 8
    dapo eval --base-url http://127.0.0.1:8000/v1 --test-file aime-2024.parquet --concurrency 64

See docs/evaluation.md.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from dapo.evaluation.backends import EvalError
from dapo.evaluation.problems import SYNTH_NAME, TEMPLATES
from dapo.evaluation.response_budget import DEFAULT_MAX_TOKENS, response_budget
from dapo.infra.device import DEVICE_CHOICES
from dapo.infra.model_name import model_name
from dapo.rollout.factory import AUTO_ENGINE, ENGINE_NAMES


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


def default_output(model: str | None, test_files: tuple[str, ...], *, multi_turn: bool = False) -> Path:
    """``runs/eval/<model>__<test files>[__multi-turn].jsonl``, the model named by :func:`dapo.infra.model_name.model_name`
    (each checkpoint of a run gets its own file: their folders are all called ``hf``); a multi-turn evaluation gets its
    own file, so it does not try to resume the single-turn one of the same model and set (and be refused)."""
    stem = "+".join(Path(f).stem for f in test_files)
    suffix = "__multi-turn" if multi_turn else ""
    return Path("runs") / "eval" / f"{_slug(model_name(model))}__{_slug(stem)}{suffix}.jsonl"


def _fmt(value: Any) -> str:
    if value is None:  # e.g. avg@K/ci95 of a single problem: no interval
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def print_table(summary: dict[str, Any], console: Console) -> None:
    metrics = summary.get("metrics") or {}
    if not metrics:
        console.print("no samples")
        return
    names: list[str] = []
    for block in metrics.values():
        for key in block:
            if key not in names and key not in ("k", "samples_per_problem"):
                names.append(key)
    table = Table(title=f"dapo eval: {summary['settings']['model']} ({summary['status']})")
    table.add_column("metric")
    for source in metrics:
        table.add_column(source, justify="right", style="bold" if source == "overall" else None)
    for name in names:
        table.add_row(name, *[_fmt(block.get(name, "")) for block in metrics.values()])
    console.print(table)


def build_local_backend(
    model: str | None,
    backend: str,
    device: str,
    max_tokens: int,
    max_batch_size: int | None,
    max_prompt_length: int | None,
    seed: int,
    tensor_parallel_size: int = 1,
    trust_remote_code: bool = False,
):
    """Load the policy and build its engine (``dapo.rollout.loaded_engine``); returns a LocalBackend and the engine's
    name (``auto`` resolved)."""
    from dapo.config import ModelConfig
    from dapo.evaluation.backends import LocalBackend
    from dapo.rollout.loaded_engine import load_model_engine
    from dapo.rollout.spec import EngineSpec

    prompt_len = max_prompt_length or 4096
    spec = EngineSpec(
        name=backend,
        seed=seed,
        max_batch_size=max_batch_size,
        max_model_len=prompt_len + max_tokens,
        tensor_parallel_size=tensor_parallel_size,
    )
    loaded = load_model_engine(
        ModelConfig(path=model, trust_remote_code=trust_remote_code),
        spec,
        device=device,
        remote_code_switch="pass --trust-remote-code",
    )
    context = getattr(loaded.policy.model.config, "max_position_embeddings", None)
    return LocalBackend(
        loaded.engine,
        loaded.tokenizer,
        max_prompt_length=max_prompt_length,
        max_model_len=int(context) if context else None,
    ), loaded.spec.name


def _test_file_id(name: str, synth_config: Path | None) -> str:
    """What a test file is, for the resume check: a resolved path, or the synthetic set and the config behind it."""
    if name != SYNTH_NAME:
        return str(Path(name).resolve())
    return name if synth_config is None else f"{name} ({synth_config.resolve()})"


@click.command("eval")
@click.option(
    "--model",
    default=None,
    help="HF model folder (default: the embedded tiny Qwen2); with --base-url the "
    "served model name (default: the first one the server lists)",
)
@click.option(
    "--test-file",
    "test_files",
    multiple=True,
    required=True,
    help=f"DAPO parquet/JSONL, raw problem/answer or question/answer JSONL, or '{SYNTH_NAME}' (repeatable)",
)
@click.option(
    "--synth-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help=f"a training config whose held-out '{SYNTH_NAME}' set to evaluate (its data.synth), e.g. "
    "configs/smollm2_135m.yaml; default: dapo train's default task",
)
@click.option(
    "--n",
    "n",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="samples per row; rows repeating a problem add theirs (the AIME file: 32 rows x n)",
)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=1.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0.0, min_open=True, max=1.0), default=0.7, show_default=True)
@click.option("--top-k", type=click.IntRange(min=-1), default=-1, show_default=True, help="-1 = off")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help=f"response length cap (the paper: 20480); default {DEFAULT_MAX_TOKENS} or what the model's context "
    "leaves after the longest prompt (with --base-url: half the served max_model_len), whichever is "
    "less; more than the context leaves is refused",
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--template",
    type=click.Choice(TEMPLATES),
    default="dapo",
    show_default=True,
    help="raw problem files: wrap problems in the DAPO prompt template, or send them as they are",
)
@click.option("--max-problems", type=click.IntRange(min=1), default=None, help="evaluate only the first N problems")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="samples JSONL (default runs/eval/MODEL__FILE.jsonl); its .summary.json sits beside it; "
    "re-running with the same file resumes",
)
@click.option("--base-url", default=None, help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="--base-url: requests in flight at most",
)
@click.option(
    "--max-retries",
    type=click.IntRange(min=0),
    default=6,
    show_default=True,
    help="--base-url: retries of a 408/429/5xx/connection failure, with exponential back-off",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0.1),
    default=600.0,
    show_default=True,
    help="--base-url: seconds per request",
)
@click.option(
    "--backend",
    type=click.Choice([AUTO_ENGINE, *ENGINE_NAMES]),
    default=AUTO_ENGINE,
    show_default=True,
    help="local engine: auto = vLLM on a GPU when installed, else HF",
)
@click.option("--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="local engine: problems per engine call (part of the sampling order: keep it to resume)",
)
@click.option("--max-prompt-length", type=click.IntRange(min=1), default=None, help="refuse longer prompts")
@click.option(
    "--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True, help="vLLM backend only"
)
@click.option(
    "--reward-workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="reward processes (0 = in-process)",
)
@click.option(
    "--trust-remote-code",
    is_flag=True,
    help="allow custom model code shipped in the model folder (only for a model you trust)",
)
@click.option(
    "--multi-turn/--single-turn",
    "multi_turn",
    default=None,
    help="run the tool loop of training (rollout.multi_turn: the model's ```python blocks run in the "
    "sandbox, their output is appended, it continues); default: as --synth-config's "
    "rollout.multi_turn.enable, else single turn. Its settings come from --synth-config's "
    "rollout.multi_turn (else the defaults); --max-tokens is the trajectory budget",
)
@click.option(
    "--max-assistant-turns",
    type=click.IntRange(min=1),
    default=None,
    help="--multi-turn: model turns per sample (overrides the config's)",
)
@click.option("--quiet", is_flag=True, help="no progress line")
def eval_command(
    model,
    test_files,
    synth_config,
    n,
    temperature,
    top_p,
    top_k,
    max_tokens,
    seed,
    template,
    max_problems,
    output,
    base_url,
    concurrency,
    max_retries,
    request_timeout,
    backend,
    device,
    batch_size,
    max_prompt_length,
    tensor_parallel_size,
    reward_workers,
    trust_remote_code,
    multi_turn,
    max_assistant_turns,
    quiet,
) -> None:
    """Evaluate a model: avg@K, pass@k, maj@K, response length and truncation rate per data_source and overall;
    with --multi-turn, also how the samples used the code interpreter (tool/*)."""
    from dapo.data.schema import DataError
    from dapo.evaluation.problems import load_problems
    from dapo.infra.atomic import FileOperationError, describe_os_error
    from dapo.infra.cleanup import close_quietly
    from dapo.evaluation.runner import EvalSettings, ProgressLine, run_eval, summary_path
    from dapo.model.loading import ModelLoadError
    from dapo.rollout.errors import EngineUnavailableError

    from dapo.config.schema import MultiTurnConfig

    console = Console()
    try:
        synth = None
        tool_loop = MultiTurnConfig()
        if synth_config is not None:
            from dapo.config import ConfigError, load_config

            try:
                loaded = load_config(synth_config)
            except ConfigError as exc:
                raise click.ClickException(f"--synth-config {synth_config}: {exc}") from None
            synth, tool_loop = loaded.data, loaded.rollout.multi_turn
        if multi_turn is None:
            multi_turn = tool_loop.enable
        if max_assistant_turns is not None:
            tool_loop = tool_loop.model_copy(update={"max_assistant_turns": max_assistant_turns})
        if multi_turn and base_url:
            raise click.ClickException(
                "--multi-turn runs the tool loop on a local engine (token in, token out); it "
                "cannot run against --base-url"
            )
        problems = load_problems(list(test_files), template=template, max_problems=max_problems, synth=synth)
        if base_url:
            from dapo.evaluation.backends import OpenAIBackend

            eval_backend = OpenAIBackend(
                base_url, model, concurrency=concurrency, max_retries=max_retries, timeout_s=request_timeout
            )
            eval_backend.probe()  # the served name (the default output's) and its context (the budget's)
            engine_name = "openai"
            reported_model = eval_backend.model
            max_tokens = response_budget(
                max_tokens, eval_backend.max_model_len, None, model=f"the served '{reported_model}'"
            )
            # a served model gets its own file: a local evaluation of the same folder has other settings
            output = output or default_output(f"{reported_model}-served", test_files)
        else:
            eval_backend, engine_name = build_local_backend(
                model,
                backend,
                device,
                max_tokens or DEFAULT_MAX_TOKENS,
                None,
                max_prompt_length,
                seed,
                tensor_parallel_size,
                trust_remote_code=trust_remote_code,
            )
            reported_model = model or "tiny-qwen2 (embedded)"
            try:
                longest = max(len(eval_backend.encode(p.messages)) for p in problems)
                max_tokens = response_budget(
                    max_tokens, eval_backend.max_model_len, longest, model=f"the model '{model_name(model)}'"
                )
            except EvalError:
                close_quietly([("the evaluation engine", eval_backend.close)])
                raise
            output = output or default_output(model, test_files, multi_turn=bool(multi_turn))
            if multi_turn:
                from dapo.rollout.tool_rollout import ToolUnavailableError, tool_rollout

                try:
                    eval_backend.engine = tool_rollout(
                        eval_backend.engine, eval_backend.tokenizer, tool_loop, max_tokens
                    )
                except ToolUnavailableError as exc:  # its message names the key
                    close_quietly([("the evaluation engine", eval_backend.close)])
                    raise click.ClickException(str(exc)) from None
        settings = EvalSettings(
            model=reported_model,
            test_files=tuple(_test_file_id(f, synth_config) for f in test_files),
            n=n,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            seed=seed,
            template=template,
            max_problems=max_problems,
            backend=engine_name,
            batch_size=batch_size,
            multi_turn=tool_loop.model_dump(mode="json", exclude={"enable"}) if multi_turn else None,
        )
        total = sum(p.repeats for p in problems) * n
        loop = (
            f", multi-turn: up to {tool_loop.max_assistant_turns} turns, sandbox {tool_loop.sandbox.mode}"
            if multi_turn
            else ""
        )
        console.print(
            f"dapo eval: {len(problems)} problems, {total} samples "
            f"({engine_name}{' at ' + eval_backend.base_url if base_url else ''}{loop}) -> {output}",
            highlight=False,
        )
        try:
            summary = run_eval(
                problems,
                eval_backend,
                settings,
                output,
                reward_workers=reward_workers,
                progress=None if quiet else ProgressLine(),
            )
        finally:
            if not base_url:  # a failing close must not hide the error that ended the evaluation
                close_quietly([("the evaluation engine", eval_backend.close)])
    except (EvalError, DataError, ModelLoadError, EngineUnavailableError, FileOperationError) as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # one line naming the path and the reason, never a traceback
        raise click.ClickException(describe_os_error(e, f"dapo eval: {e.filename or output}")) from None
    print_table(summary, console)
    console.print(f"samples: {output}; summary: {summary_path(output)}", highlight=False)
