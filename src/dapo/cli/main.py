"""The `dapo` command line: parse, build the config, call the layer that does the work."""

from __future__ import annotations

import click

from dapo import __version__
from dapo.cli.data_cmd import data_group
from dapo.cli.plot_cmd import plot_command
from dapo.cli.train_cmd import train_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dapo")
def cli() -> None:
    """dapo: Decoupled Clip and Dynamic sAmpling Policy Optimization for LLMs (arXiv 2503.14476)."""


cli.add_command(train_command, "train")
cli.add_command(data_group, "data")
cli.add_command(plot_command, "plot")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
