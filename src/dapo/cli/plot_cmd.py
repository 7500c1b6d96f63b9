"""``dapo plot RUN_DIR [RUN_DIR...] --out FILE.png [--label NAME ...] [--metrics a,b] [--smooth W]``: monitoring
panels of runs."""

from __future__ import annotations

from pathlib import Path

import click

from dapo.infra.tracking import METRICS_FILE_NAME

__all__ = ["plot_command"]


@click.command("plot")
@click.argument(
    "run_dirs",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path),
    metavar="RUN_DIR [RUN_DIR...]",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="PNG file to write (folders are created).",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="Legend name of each run, in RUN_DIR order (default: the folder names).",
)
@click.option(
    "--metrics",
    "metrics",
    default=None,
    help="Comma-separated panels: response_length, score, entropy, mean_prob, val_acc, rollout_acc, train_acc, or "
    "any logged metric key (default: all seven).",
)
@click.option(
    "--smooth",
    type=click.FloatRange(0.0, 1.0, max_open=True),
    default=0.0,
    show_default=True,
    help="EMA weight of a smoothed line over the raw one (e.g. 0.6); validation points are never smoothed.",
)
def plot_command(
    run_dirs: tuple[Path, ...], out: Path, labels: tuple[str, ...], metrics: str | None, smooth: float
) -> None:
    """Plot response length (tokens), reward, entropy (nats), mean probability and accuracies of one or more runs.

    Several RUN_DIRs are overlaid, one colour each, to compare ablations. Panels on the training batch (the groups
    Dynamic Sampling kept) say so; rollout_acc is the learning curve before filtering. Accuracy axes are [0, 1];
    validation accuracies with different k get separate panels.
    """
    for run_dir in run_dirs:
        if not (run_dir / METRICS_FILE_NAME).is_file():
            raise click.BadParameter(
                f"{run_dir} has no {METRICS_FILE_NAME} (is it a dapo run directory?)", param_hint="RUN_DIR"
            )
    if labels and len(labels) != len(run_dirs):
        raise click.BadParameter(
            f"got {len(labels)} --label for {len(run_dirs)} RUN_DIR; give one per run or none", param_hint="--label"
        )
    if out.suffix.lower() != ".png":
        raise click.BadParameter(f"{out} must end in .png", param_hint="--out")

    from dapo.infra.plot import plot_runs  # matplotlib import only when the command runs

    chosen = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    try:
        written = plot_runs(run_dirs, out, labels=list(labels) if labels else None, metrics=chosen, smooth=smooth)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--metrics") from None
    except OSError as exc:  # plot_runs names the file and the reason (FileOperationError)
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {written}")
