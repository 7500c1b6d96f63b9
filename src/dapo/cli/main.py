"""The `dapo` command line: parse, build the config, call the layer that does the work."""

from __future__ import annotations

import os

from dapo.cli.openmp import default_to_passive

# Before torch is imported: passive OpenMP waiting unless a command knows it computes alone (dapo.cli.openmp).
default_to_passive()
# A progress bar per weight load would interleave with the commands' own progress lines.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# vLLM logs every scheduler event and weight push at INFO; a training run pushes weights every step.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import click  # noqa: E402

from dapo import __version__  # noqa: E402
from dapo.cli.data_cmd import data_group  # noqa: E402
from dapo.cli.eval_cmd import eval_command  # noqa: E402
from dapo.cli.explain_cmd import explain_command  # noqa: E402
from dapo.cli.generate_cmd import generate_command  # noqa: E402
from dapo.cli.serve_cmd import serve_command  # noqa: E402
from dapo.cli.plot_cmd import plot_command  # noqa: E402
from dapo.cli.train_cmd import train_command  # noqa: E402


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dapo")
def cli() -> None:
    """dapo: Decoupled Clip and Dynamic sAmpling Policy Optimization for LLMs (arXiv 2503.14476)."""


cli.add_command(train_command, "train")
cli.add_command(data_group, "data")
cli.add_command(plot_command, "plot")
cli.add_command(eval_command, "eval")
cli.add_command(serve_command, "serve")
cli.add_command(generate_command, "generate")
cli.add_command(explain_command, "explain")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
