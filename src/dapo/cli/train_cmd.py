"""`dapo train`: build the config at the edge, run Algorithm 1, report first/last validation accuracy and the plot.

Under torchrun (``WORLD_SIZE`` > 1) the same command is one data-parallel rank: the World is built here, once, and
passed down (``docs/distributed.md``); rank 0 alone prints and plots.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import click
import yaml

from dapo.config import ConfigError, config_to_dict
from dapo.config.loading import load_config_with_report


@click.command("train", context_settings={"ignore_unknown_options": True})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    multiple=True,
    help="YAML config (see configs/); repeat it to merge several in order (later files win, key by "
    "key); defaults train the embedded tiny model on the synthetic task.",
)
@click.option("--print-config", is_flag=True, help="Print the resolved config and exit.")
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def train_command(config_path: tuple[str, ...], print_config: bool, overrides: tuple[str, ...]) -> None:
    """Train a policy with DAPO. OVERRIDES are dotted keys, e.g. algorithm.clip_ratio_high=0.28 rollout.n=16."""
    try:
        cfg, report = load_config_with_report(config_path or None, overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for line in report.warnings:  # as load_config logs them
        logging.getLogger("dapo.config").warning("%s", line)
    if print_config:
        from dapo.config.objective import describe_objective

        # YAML comments: the output stays a loadable config
        click.echo(f"# objective: {describe_objective(cfg)}")
        for line in report.notices:
            click.echo(f"# note: {line}")
        click.echo(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        return
    for line in report.notices:  # before logging is set up, so on stderr directly
        click.echo(f"note: {line}", err=True)
    # Imported here so `dapo --help` and config errors stay instant (and torch loads after the OpenMP choice).
    from dapo.data.prompts import PromptTooLongError
    from dapo.data.schema import DataError
    from dapo.distributed.lost_rank import is_lost_peer, lost_rank_message
    from dapo.distributed.world import World
    from dapo.evaluation.validation import val_acc_key
    from dapo.infra.atomic import FileOperationError
    from dapo.model.loading import ModelLoadError
    from dapo.reward.pool import RewardScoringError
    from dapo.reward.registry import UnknownDataSourceError
    from dapo.rollout.errors import EngineUnavailableError
    from dapo.rollout.sampler import NonFiniteLogitsError
    from dapo.rollout.worker import RolloutWorkerError
    from dapo.training.dynamic_sampling_buffer import DynamicSamplingExhausted
    from dapo.training.errors import TrainingError
    from dapo.training.loop import train
    from dapo.training.run_state import resume_hint

    try:
        world = World.from_env()  # the single process unless torchrun started this one
    except (RuntimeError, ValueError, KeyError) as exc:  # rendezvous failed, or a torchrun variable is missing
        raise click.ClickException(f"joining the torchrun process group failed: {type(exc).__name__}: {exc}") from None
    # Every rank logs (a rank's own failure is only in its log), rank 0 at INFO, the others their warnings only.
    logging.basicConfig(
        level=logging.INFO if world.is_main else logging.WARNING,
        stream=sys.stderr,
        format=(
            "%(levelname)s %(name)s: %(message)s"
            if not world.distributed
            else f"%(levelname)s [rank {world.rank}] %(name)s: %(message)s"
        ),
    )
    if world.distributed:  # torchrun's SIGTERM after another rank failed: say so, instead of dying silently

        def stopped_by_torchrun(signum, frame):
            raise click.ClickException(lost_rank_message(None, world.rank, world.world_size, resume_hint(cfg)))

        signal.signal(signal.SIGTERM, stopped_by_torchrun)
    try:
        result = train(cfg, world=world)
        world.barrier()  # every rank has finished its last collective before the process group goes
    except (
        TrainingError,
        ModelLoadError,
        DataError,
        PromptTooLongError,
        RewardScoringError,
        UnknownDataSourceError,
        EngineUnavailableError,
        DynamicSamplingExhausted,
        FileOperationError,
        NonFiniteLogitsError,
    ) as exc:
        # No barrier or teardown here: the other ranks may wait in a collective this rank never reaches; this
        # rank's non-zero exit makes torchrun stop them.
        raise click.ClickException(str(exc) if not world.distributed else f"rank {world.rank}: {exc}") from None
    except RolloutWorkerError as exc:  # the worker died, failed or stalled: say so, and where a rerun resumes
        raise click.ClickException(f"{exc}. {resume_hint(cfg)}") from None
    except RuntimeError as exc:  # another rank died: gloo / NCCL raise from the collective this rank was in
        if not (world.distributed and is_lost_peer(exc)):
            raise
        raise click.ClickException(lost_rank_message(exc, world.rank, world.world_size, resume_hint(cfg))) from None
    finally:
        # This rank is on its way out (done or failing, its message printed next): a SIGTERM from torchrun now,
        # after another rank failed, must not raise inside the interpreter's exit (an atexit callback printed a
        # traceback that way in CI), nor be ignored (an exit held up by a torn process group would then wait for
        # torchrun's SIGKILL, or forever under an agent that sends none): it ends the process at once, quietly.
        if world.distributed:
            signal.signal(signal.SIGTERM, exit_quietly)
    world.close()
    if not world.is_main:  # rank 0 reports and plots the run: its record is the run's
        return
    if result.steps_run == 0:
        click.echo(
            f"nothing to do: {result.run_dir} is already trained to step {result.steps_done} "
            "(raise trainer.total_training_steps to train further)"
        )
        return
    from dapo.infra.plot import plot_runs  # matplotlib (~0.8 s): only rank 0 of a run that trained draws

    try:
        plot_path = plot_runs([result.run_dir], result.run_dir / "plots" / "training.png")
    except FileOperationError as exc:  # the run is trained and saved; a missing picture must not fail it
        click.echo(f"warning: {exc}", err=True)
        plot_path = None
    first, last = result.val_acc(0), result.val_acc(-1)
    trained = (
        f"{result.steps_done} steps"
        if result.steps_run == result.steps_done
        else f"{result.steps_run} steps (resumed at step {result.steps_done - result.steps_run}, now at step "
        f"{result.steps_done})"
    )
    click.echo(f"done: {trained} in {result.wall_s:.0f} s, peak memory {result.peak_rss_mb:.0f} MB")
    if first is not None and last is not None:
        k_key = val_acc_key(result.val_history[-1][1])
        click.echo(
            f"validation {k_key}: first {first:.3f} (step {result.val_history[0][0]}) -> "
            f"last {last:.3f} (step {result.val_history[-1][0]}), {100 * (last - first):+.1f} points"
        )
    click.echo(f"metrics: {result.run_dir / 'metrics.jsonl'}; plots: {plot_path or 'not written'}")
    profiles = [result.run_dir / "profile" / f"step{k}.txt" for k in cfg.trainer.profile_steps]
    profiles = [str(p) for p in profiles if p.is_file()]
    if profiles:  # torch's profiler prints its USDT start/stop lines on each phase and never says where this went
        click.echo(
            f"profile (trainer.profile_steps; operators by self time, .json beside each; the 'USDT "
            f"profiler_start/stop' lines above are torch's profiler's own): {', '.join(profiles)}"
        )


def exit_quietly(signum: int, frame: object) -> None:
    """SIGTERM once the command has ended: flush what was printed and exit, with no traceback (``train``)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream: nothing to flush
            pass
    os._exit(128 + signum)
