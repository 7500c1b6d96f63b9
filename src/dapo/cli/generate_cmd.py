"""``dapo generate``: the published inference example as a command -- question, ground truth, model output.

dapo generate --prompt "Tom has 3 apples and buys 4 more. How many apples does he have?" --template dapo
dapo generate --model runs/x/checkpoints/global_step_30/hf --file ../shared/data/aime-2025.jsonl --limit 3
"""

from __future__ import annotations

from pathlib import Path

import click

from dapo.data.template import apply_dapo_template
from dapo.infra.device import DEVICE_CHOICES
from dapo.rollout.factory import AUTO_ENGINE, ENGINE_NAMES


@click.command("generate")
@click.option("--model", default=None, help="HF model folder (default: the embedded tiny Qwen2)")
@click.option("--prompt", "prompt_text", default=None, help="one question")
@click.option(
    "--file",
    "file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="questions: DAPO parquet/JSONL or raw problem/answer (question/answer) JSONL",
)
@click.option(
    "--template",
    type=click.Choice(["none", "dapo"]),
    default="none",
    show_default=True,
    help="dapo: wrap raw questions in the DAPO prompt template (DAPO-schema files keep their prompts)",
)
@click.option("--limit", type=click.IntRange(min=1), default=5, show_default=True, help="--file: first N questions")
@click.option("--n", "n", type=click.IntRange(min=1), default=1, show_default=True, help="samples per question")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=1.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0.0, min_open=True, max=1.0), default=0.7, show_default=True)
@click.option("--top-k", type=click.IntRange(min=-1), default=-1, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--backend", type=click.Choice([AUTO_ENGINE, *ENGINE_NAMES]), default=AUTO_ENGINE, show_default=True)
@click.option("--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True)
@click.option(
    "--trust-remote-code",
    is_flag=True,
    help="allow custom model code shipped in the model folder (only for a model you trust)",
)
def generate_command(
    model,
    prompt_text,
    file,
    template,
    limit,
    n,
    temperature,
    top_p,
    top_k,
    max_tokens,
    seed,
    backend,
    device,
    trust_remote_code,
) -> None:
    """Sample answers to questions and print question, ground truth (when known) and output."""
    from dapo.cli.eval_cmd import build_local_backend
    from dapo.data.schema import DataError
    from dapo.evaluation.problems import load_test_records
    from dapo.model.loading import ModelLoadError
    from dapo.rollout.base import SamplingParams
    from dapo.rollout.errors import EngineUnavailableError

    if (prompt_text is None) == (file is None):
        raise click.UsageError("give exactly one of --prompt and --file")
    try:
        if prompt_text is not None:
            if not prompt_text.strip():
                raise click.UsageError("--prompt is empty")
            text = apply_dapo_template(prompt_text) if template == "dapo" else prompt_text
            items = [([{"role": "user", "content": text}], None)]
        else:
            records = load_test_records(file, template="dapo" if template == "dapo" else "raw")[:limit]
            items = [(r.messages(), r.ground_truth) for r in records]
        local, _ = build_local_backend(
            model, backend, device, max_tokens, None, None, seed, trust_remote_code=trust_remote_code
        )
        try:
            params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed)
            outputs = local.generate([m for m, _ in items], [n] * len(items), params)
        finally:
            local.close()
    except (DataError, ModelLoadError, EngineUnavailableError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    rule = "=" * 80
    for (messages, truth), samples in zip(items, outputs):
        click.echo(rule)
        click.echo(f"[question]\n{messages[-1]['content']}")
        if truth is not None:
            click.echo(f"[ground truth]\n{truth}")
        for j, sample in enumerate(samples):
            label = "[output]" if len(samples) == 1 else f"[output {j + 1}/{len(samples)}]"
            click.echo(f"{label} ({sample.response_tokens} tokens, finish: {sample.finish_reason})\n{sample.text}")
    click.echo(rule)
