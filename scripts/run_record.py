"""Record a finished `dapo train` run under docs/runs/ so that scripts/render_docs.py can render its figures.

    python scripts/run_record.py run RUN_DIR docs/runs/NAME --what "..." --command "dapo train ..." --load "..." \
        [--log CONSOLE_LOG]
    python scripts/run_record.py seeded docs/runs/ablation runs/ablation/*-s* --what ... --command ... --load ...

One run's record is the layout of docs/runs/default/: ``metrics.jsonl.gz`` (the run's metrics.jsonl, gzip),
``config.yaml`` (its resolved config) and ``run.json`` (what it is, when, the commit, the command, the CPU, how loaded
the machine was, and the wall time and peak memory the run printed). A seeded set (scripts/run_ablation.sh's
``<config>-s<seed>`` runs) is the layout of docs/runs/objectives/: ``<run>.metrics.jsonl.gz`` per run and one
``runs.json`` with each run's wall time and peak memory (from its ``log-<run>.txt`` beside it). These two functions are
the one writer of each layout; the benchmark scripts that record runs call them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from dapo.infra.atomic import atomic_write
from dapo.infra.perf import cpu_name

ROOT = Path(__file__).resolve().parents[1]
DONE = re.compile(r"done: \d+ steps in ([\d,]+) s, peak memory ([\d,]+) MB")


def commit() -> str:
    """The checkout's short commit, with ``+changes`` when the tree has uncommitted edits."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def provenance(what: str, command: str, load: str, started: datetime | None, at_commit: str | None) -> dict:
    """What every record says of itself: what it is, when, the commit, the command, the CPU, the machine's load.
    ``at_commit``: the commit the run started at (the tree may move on while a long run goes); default the current."""
    return {
        "what": what,
        "date": (started or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%MZ"),
        "commit": at_commit or commit(),
        "command": command,
        "host_cpu": cpu_name(),
        "load": load,
    }


def _gzip(src: Path, dst: Path) -> None:
    """``src`` gzipped to ``dst``, with no time stamp in the header (re-recording the same run gives the same file)."""
    with src.open("rb") as f, gzip.GzipFile(dst, "wb", mtime=0) as g:
        shutil.copyfileobj(f, g)


def printed_summary(console: str) -> tuple[list[str], int | None, int | None]:
    """The run's closing lines (``done: ...``, ``validation ...``) and the wall seconds and peak MB they state."""
    lines = [line for line in console.splitlines() if line.startswith(("done: ", "validation "))]
    m = DONE.search(console)
    wall, peak = (int(m[1].replace(",", "")), int(m[2].replace(",", ""))) if m else (None, None)
    return lines, wall, peak


def record_run(
    run_dir: Path,
    out: Path,
    *,
    what: str,
    command: str,
    load: str,
    console: str = "",
    started: datetime | None = None,
    at_commit: str | None = None,
    extra: dict | None = None,
) -> Path:
    """Write ``out``/{metrics.jsonl.gz, config.yaml, run.json} from the run directory ``run_dir``; returns ``out``.
    Refuses a run directory without metrics (nothing half-written: run.json is written last, atomically)."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file() or not metrics.stat().st_size:
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl to record (is it a dapo train run directory?)")
    out.mkdir(parents=True, exist_ok=True)
    _gzip(metrics, out / "metrics.jsonl.gz")
    if (run_dir / "config.yaml").is_file():
        shutil.copyfile(run_dir / "config.yaml", out / "config.yaml")
    printed, wall, peak = printed_summary(console)
    meta = {
        **provenance(what, command, load, started, at_commit),
        "printed": printed,
        "wall_s": wall,
        "peak_rss_mb": peak,
        **(extra or {}),
    }
    atomic_write(out / "run.json", json.dumps(meta, indent=1) + "\n")
    return out


def record_seeded_runs(
    run_dirs: list[Path],
    out: Path,
    *,
    what: str,
    command: str,
    load: str,
    started: datetime | None = None,
    at_commit: str | None = None,
) -> Path:
    """Write ``out``/<run>.metrics.jsonl.gz for every run directory and ``out``/runs.json (written last, atomically):
    the set's provenance, the generation round's group count (for the group shares) and each run's wall seconds and
    peak MB from its console log ``log-<run>.txt`` (None where the log lacks them)."""
    import yaml

    runs = [d for d in sorted(run_dirs) if d.is_dir()]  # a glob like runs/x/*-s* also matches the logs beside them
    if not runs:
        raise FileNotFoundError(f"no run directories among {[str(d) for d in run_dirs]}")
    missing = [str(d) for d in runs if not (d / "metrics.jsonl").is_file()]
    if missing:
        raise FileNotFoundError(f"no metrics.jsonl in {', '.join(missing)}")
    per_round = set()
    for d in runs:
        data = yaml.safe_load((d / "config.yaml").read_text())["data"]
        per_round.add(int(data.get("gen_batch_size") or data["train_batch_size"]))
    if len(per_round) != 1:
        raise ValueError(f"the runs generate different numbers of groups per round ({sorted(per_round)}): not one set")
    out.mkdir(parents=True, exist_ok=True)
    wall, peak = {}, {}
    for d in runs:
        _gzip(d / "metrics.jsonl", out / f"{d.name}.metrics.jsonl.gz")
        log = d.parent / f"log-{d.name}.txt"
        _, wall[d.name], peak[d.name] = printed_summary(log.read_text(errors="replace") if log.exists() else "")
    meta = {
        **provenance(what, command, load, started, at_commit),
        "groups_per_round": per_round.pop(),
        "wall_s": wall,
        "peak_rss_mb": peak,
    }
    atomic_write(out / "runs.json", json.dumps(meta, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    one = sub.add_parser("run", help="one run directory -> docs/runs/NAME/")
    one.add_argument("run_dir", type=Path, help="the run directory (holds metrics.jsonl and config.yaml)")
    one.add_argument("out", type=Path, help="the record's folder, e.g. docs/runs/smollm2-135m")
    one.add_argument("--log", type=Path, help="the run's console output (for its closing lines)")
    seeded = sub.add_parser("seeded", help="a set of <config>-s<seed> runs -> docs/runs/NAME/")
    seeded.add_argument("out", type=Path, help="the record's folder, e.g. docs/runs/ablation")
    seeded.add_argument("run_dirs", type=Path, nargs="+", help="the runs (their log-<run>.txt beside them)")
    for p in (one, seeded):
        p.add_argument("--what", required=True, help="one line: what the run is")
        p.add_argument("--command", required=True, help="the command as a user types it")
        p.add_argument("--load", required=True, help="what else ran on the machine meanwhile")
        p.add_argument("--started", help="when it started, ISO 8601 UTC (default: now)")
        p.add_argument("--commit", help="the commit it started at (default: the checkout's now)")
    args = parser.parse_args(argv)
    started = datetime.fromisoformat(args.started.replace("Z", "+00:00")) if args.started else None
    common = dict(what=args.what, command=args.command, load=args.load, started=started, at_commit=args.commit)
    if args.kind == "run":
        console = args.log.read_text(errors="replace") if args.log else ""
        out = record_run(args.run_dir, args.out, console=console, **common)
    else:
        out = record_seeded_runs(args.run_dirs, args.out, **common)
    print(f"recorded -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
