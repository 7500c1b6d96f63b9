"""On-policy distillation against DAPO, recorded: every run's metrics and provenance into docs/runs/distillation/,
rendered into docs/distillation.md's Measurements by scripts/render_docs.py, and a plot into docs/img/.

    python scripts/bench_distillation.py                                   # tiny: teacher, 3 arms x seeds 1-3
    python scripts/bench_distillation.py --teacher runs/teacher/checkpoints/global_step_30/hf
    python scripts/bench_distillation.py --preset smollm2 --teacher <a DAPO-trained SmolLM2 folder>

1. the teacher: ``dapo train`` (the default run, ``--teacher-steps`` 30) unless ``--teacher PATH`` names one;
2. from the base model, each arm with seeds ``--seeds`` (trainer.seed and data.seed, as scripts/run_ablation.sh),
   ``--steps`` steps, validation as the preset's run (the default run: every 5 steps and before training):
   ``pg-opd`` (the teacher's signal alone: use_task_rewards=false, use_policy_gradient=true, loss_mode=k1),
   ``dapo`` (no teacher), ``opd-reward`` (the same k1 signal added to the reward's advantage);
3. the teacher in the trainer's process vs served by ``dapo serve`` on loopback: ``--timing-steps`` steps of the
   pg-opd arm each, validation off (``timing_s/step`` and ``timing_s/teacher`` per step).

Each run is one folder under ``--out`` (``<preset>-<arm>-s<seed>``, ``<preset>-teacher``, ``<preset>-teacher-in-process``,
``<preset>-teacher-http``) holding what docs/runs/default/ holds: metrics.jsonl.gz, config.yaml and run.json (command,
date, commit, host CPU, wall_s, the teacher's path and its validation accuracy: the student's validation run by the
teacher at step 0 of the first pg-opd run, ``distill/teacher/teacher_model/<key>``). Then
``python scripts/render_docs.py`` fills the page. Run it on an otherwise idle machine: the wall times are figures.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "runs" / "distillation"
IMG = REPO / "docs" / "img"
PRESETS = {"tiny": None, "smollm2": "configs/smollm2_135m.yaml"}
DEFAULT_SEEDS = {"tiny": "1,2,3", "smollm2": "1"}
TEACHER_NAME = "teacher_model"  # verl's name for a single teacher
ARMS: dict[str, list[str]] = {  # in this order: pg-opd first, its step 0 measures the teacher for the others
    "pg-opd": [
        "distillation.distillation_loss.use_task_rewards=false",
        "distillation.distillation_loss.use_policy_gradient=true",
        "distillation.distillation_loss.loss_mode=k1",
    ],
    "opd-reward": [
        "distillation.distillation_loss.use_task_rewards=true",
        "distillation.distillation_loss.use_policy_gradient=true",
        "distillation.distillation_loss.loss_mode=k1",
    ],
    "dapo": [],
}
NO_VALIDATION = ["trainer.test_freq=-1", "trainer.val_before_train=false"]


def sibling(name: str):  # type: ignore[no-untyped-def]
    """scripts/<name>.py as a module (scripts/ is not a package): render_docs, whose renderers the plot's curves
    follow, and run_record, the one writer of a docs/runs/ record."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def dapo(*args: str) -> list[str]:
    """The command that runs ``dapo ARGS`` with this interpreter (and the tree it imports)."""
    return [sys.executable, "-m", "dapo.cli.main", *args]


def shown(command: Sequence[str]) -> str:
    return " ".join(["dapo", *command[3:]])


class Bench:
    """One invocation's settings and where its records go."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.preset = args.preset
        self.config = PRESETS[args.preset]
        self.out: Path = args.out
        self.img: Path = args.img
        self.work: Path = args.work_dir
        self.overrides: list[str] = list(args.override)
        self.load: str = args.load
        self.run_deadline_s: float = args.run_deadline_s

    def train(self, name: str, overrides: Sequence[str], *, what: str, teacher: dict | None, **fields: object) -> dict:
        """``dapo train`` as run ``name`` (work dir ``self.work``), recorded into ``self.out/name``; its run.json."""
        shutil.rmtree(self.work / name, ignore_errors=True)
        command = dapo(
            "train",
            *(["--config", str(REPO / self.config)] if self.config else []),
            *overrides,
            *self.overrides,
            f"trainer.default_local_dir={self.work}",
            f"trainer.experiment_name={name}",
        )
        started = datetime.now(timezone.utc)
        at_commit = sibling("run_record").commit()  # the tree may move on during the run
        start = time.perf_counter()
        console = []
        with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as proc:
            # the deadline kills a stuck run, which ends the read below (dapo train bounds its own waits; this bounds
            # the bench's wait on dapo train)
            watchdog = threading.Timer(self.run_deadline_s, proc.kill)
            watchdog.start()
            try:
                for line in proc.stdout:  # shown as it comes (the run's progress), kept for its closing lines
                    sys.stdout.write(line)
                    console.append(line)
            finally:
                watchdog.cancel()
        if time.perf_counter() - start >= self.run_deadline_s:
            raise SystemExit(f"{name}: still running after --run-deadline-s={self.run_deadline_s:g} s, killed")
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, command)
        wall = time.perf_counter() - start
        record = self.out / name
        shutil.rmtree(record, ignore_errors=True)
        sibling("run_record").record_run(
            self.work / name,
            record,
            what=what,
            command=shown(command).replace(str(self.work), "<dir>").replace(str(REPO) + "/", ""),
            load=self.load,
            console="".join(console),
            started=started,
            at_commit=at_commit,
            extra={"preset": self.preset, "wall_s": round(wall, 1), **fields, "teacher": teacher},
        )
        return json.loads((record / "run.json").read_text())

    def distill(self, teacher_path: str) -> list[str]:
        return ["distillation.enabled=true", f"distillation.teacher_models.{TEACHER_NAME}.model_path={teacher_path}"]


def validation_of(records: list[dict], prefix: str = "") -> tuple[str, float] | None:
    """The first ``val/acc/mean@k`` (under ``prefix``) of ``records``: its key and value."""
    for r in records:
        for key, value in r.items():
            if key.startswith(prefix + "val/acc/mean@") and key.count("/") == prefix.count("/") + 2:
                return key.removeprefix(prefix), float(value)
    return None


def read_records(folder: Path) -> list[dict]:
    return sibling("render_docs").metrics(folder / "metrics.jsonl.gz")


def trained_teacher(bench: Bench, steps: int) -> dict:
    """The tiny teacher: the default run, recorded as ``<preset>-teacher``; its last checkpoint's hf/ folder."""
    name = f"{bench.preset}-teacher"
    bench.train(name, [f"trainer.total_training_steps={steps}"], what="the teacher: the default run", teacher=None)
    latest = (bench.work / name / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip()
    path = bench.work / name / "checkpoints" / f"global_step_{latest}" / "hf"
    val = [r for r in read_records(bench.out / name) if any(k.startswith("val/acc/mean@") for k in r)]
    found = validation_of(val[-1:])
    return {"path": str(path), "run": name, "own_validation": None if found is None else dict([found])}


def arms(bench: Bench, teacher: dict, seeds: list[int], steps: int) -> None:
    for arm, settings in ARMS.items():
        for seed in seeds:
            uses = arm != "dapo"
            run = bench.train(
                f"{bench.preset}-{arm}-s{seed}",
                [
                    *(bench.distill(teacher["path"]) + settings if uses else []),
                    f"trainer.total_training_steps={steps}",
                    f"trainer.seed={seed}",
                    f"data.seed={seed}",
                ],
                what=f"arm {arm}, seed {seed}",
                teacher=teacher if uses else {**teacher, "used": False},
                arm=arm,
                seed=seed,
            )
            if uses and "val_acc" not in teacher:  # the teacher on the student's validation, at this run's step 0
                found = validation_of(
                    read_records(bench.out / f"{bench.preset}-{arm}-s{seed}"), f"distill/teacher/{TEACHER_NAME}/"
                )
                if found is not None:
                    teacher["val_key"], teacher["val_acc"] = found
                    run["teacher"] = teacher
                    (bench.out / f"{bench.preset}-{arm}-s{seed}" / "run.json").write_text(
                        json.dumps(run, indent=1) + "\n"
                    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(folder: str, deadline_s: float) -> Iterator[tuple[str, str]]:
    """``dapo serve FOLDER`` on a loopback port, answering /v1/models within ``deadline_s``: its URL and command."""
    port = free_port()
    command = dapo("serve", folder, "--host", "127.0.0.1", "--port", str(port), "--backend", "hf")
    server = subprocess.Popen(command, cwd=REPO)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        start = time.monotonic()
        while True:
            if server.poll() is not None:
                raise SystemExit(f"dapo serve {folder} exited with {server.returncode} before answering")
            try:
                with urllib.request.urlopen(url + "/models", timeout=5):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() - start > deadline_s:
                    raise SystemExit(f"dapo serve {folder} did not answer {url}/models within {deadline_s:.0f} s")
                time.sleep(1.0)
        yield url, shown(command)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def teacher_timing(bench: Bench, teacher: dict, steps: int, deadline_s: float) -> None:
    settings = [
        *ARMS["pg-opd"],
        f"trainer.total_training_steps={steps}",
        "trainer.seed=1",
        "data.seed=1",
        *NO_VALIDATION,
    ]
    what = "teacher timing: the pg-opd arm with the teacher {}, validation off"
    bench.train(
        f"{bench.preset}-teacher-in-process",
        [*bench.distill(teacher["path"]), *settings],
        what=what.format("in the trainer's process"),
        teacher=teacher,
        timing="in-process",
    )
    with served(teacher["path"], deadline_s) as (url, serve_command):
        run = bench.train(
            f"{bench.preset}-teacher-http",
            [*bench.distill(url), *settings],
            what=what.format("served by dapo serve on loopback"),
            teacher={**teacher, "url": url, "serve_command": serve_command.replace(str(REPO) + "/", "")},
            timing="http",
        )
    print(f"teacher timing recorded ({run['wall_s']} s served)")


def plot(bench: Bench) -> Path:
    """Held-out accuracy against step and against training time, per arm (mean over seeds, each seed faint)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    docs = sibling("render_docs")
    curves = docs.distillation_curves(bench.preset, bench.out)
    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    by_step, by_time = fig.subplots(1, 2, sharey=True)
    teacher = docs.distillation_teacher_accuracy(bench.preset, bench.out)
    for colour, (arm, seeds) in zip(("C0", "C1", "C2"), curves.items()):
        faint = len(seeds) > 1
        for curve in seeds:
            steps, seconds, acc = zip(*curve)
            by_step.plot(steps, acc, color=colour, alpha=0.3 if faint else 1.0, label=None if faint else arm)
            by_time.plot(seconds, acc, color=colour, alpha=0.3 if faint else 1.0)
        if faint:  # the seeds validate at the same steps: their mean, point by point
            points = min(len(c) for c in seeds)
            mean = [[sum(c[i][j] for c in seeds) / len(seeds) for i in range(points)] for j in range(3)]
            by_step.plot(mean[0], mean[2], color=colour, marker=".", label=f"{arm} (mean of {len(seeds)} seeds)")
            by_time.plot(mean[1], mean[2], color=colour, marker=".")
    for ax in (by_step, by_time):
        if teacher is not None:
            ax.axhline(teacher, color="grey", linestyle="--", linewidth=1, label="teacher" if ax is by_step else None)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    by_step.set(xlabel="training step", ylabel="held-out accuracy (val/acc/mean@k)")
    by_time.set(xlabel="seconds of steps and validations")
    by_step.legend()
    date = docs.distillation_runs(bench.preset, bench.out)[0][0]["date"][:10]  # the records' own date
    fig.suptitle(f"On-policy distillation vs DAPO, {bench.preset} ({date})")
    fig.tight_layout()
    bench.img.mkdir(parents=True, exist_ok=True)
    path = bench.img / f"distillation-{bench.preset}.png"
    fig.savefig(path, dpi=110)
    return path


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--teacher", default=None, help="a teacher model folder (default: train one, tiny only)")
    parser.add_argument("--teacher-steps", type=int, default=30, help="steps of the teacher's default run")
    parser.add_argument("--seeds", default=None, help="comma-separated (default: 1,2,3 tiny, 1 smollm2)")
    parser.add_argument("--steps", type=int, default=30, help="steps of each arm's run")
    parser.add_argument("--timing-steps", type=int, default=5, help="steps of each teacher-timing run (0: none)")
    parser.add_argument(
        "--run-deadline-s", type=float, default=4 * 3600.0, help="seconds each dapo train may take before it is killed"
    )
    parser.add_argument("--serve-deadline", type=float, default=300.0, help="seconds dapo serve has to answer")
    parser.add_argument("--override", action="append", default=[], help="KEY=VALUE for every run (repeatable)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the records go (a docs/runs/<name>/ folder)")
    parser.add_argument("--img", type=Path, default=IMG)
    parser.add_argument("--load", default="not stated", help="what else ran on the machine meanwhile (recorded)")
    parser.add_argument("--work-dir", type=Path, default=REPO / "runs" / "bench-distillation")
    args = parser.parse_args(argv)
    if args.preset != "tiny" and args.teacher is None:
        parser.error(f"--preset {args.preset} needs --teacher PATH (a DAPO-trained model folder)")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    bench = Bench(args)
    seeds = [int(s) for s in (args.seeds or DEFAULT_SEEDS[args.preset]).split(",")]
    teacher = {"path": args.teacher} if args.teacher else trained_teacher(bench, args.teacher_steps)
    arms(bench, teacher, seeds, args.steps)
    if args.timing_steps > 0:
        teacher_timing(bench, teacher, args.timing_steps, args.serve_deadline)
    print(f"records in {bench.out}; plot {plot(bench)}; now run python scripts/render_docs.py")


if __name__ == "__main__":
    main()
