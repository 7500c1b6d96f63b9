"""scripts/bench_distillation.py at its smallest (1-step runs of a 4-prompt batch, one seed, 2 timing steps): it trains
the teacher, runs the three arms and both teacher placements as real `dapo train` and `dapo serve` processes, records
each run as docs/runs/default/ is recorded, and scripts/render_docs.py renders docs/distillation.md's Measurements from
those records (the figures are the records', recomputed here)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.cli.cli_helpers import FAST

ROOT = Path(__file__).resolve().parents[2]
# FAST's run, but the steps and the validation are the script's to set (its overrides come after the script's own)
SMALL = [
    *(o for o in FAST if not o.startswith(("trainer.total_training_steps=", "trainer.test_freq="))),
    "trainer.progress=false",
    "data.max_response_length=24",
]
RUNS = (
    "tiny-teacher",
    "tiny-pg-opd-s1",
    "tiny-opd-reward-s1",
    "tiny-dapo-s1",
    "tiny-teacher-in-process",
    "tiny-teacher-http",
)


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _WarmTrain:
    """What the bench uses of ``subprocess.Popen`` for a ``dapo train`` command, run as the same command in a child
    forked warm (tests/harness/runners.py: no ~8 s of imports for each of its runs); stderr drained to ours."""

    def __init__(self, command: list[str], cwd: Path | None = None, **_: object) -> None:
        import threading

        from tests.harness.runners import WarmDapo

        self._child = WarmDapo(command[3:], None, cwd=cwd)
        self.stdout = self._child.stdout
        self._drain = threading.Thread(target=lambda: sys.stderr.write(self._child.stderr.read()), daemon=True)
        self._drain.start()

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def kill(self) -> None:
        self._child.kill()

    def __enter__(self) -> _WarmTrain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stdout.close()
        self._child.wait(timeout=600)
        self._drain.join(timeout=30)


def _warm_trains() -> ModuleType:
    """The bench's ``subprocess`` with its ``dapo train`` runs forked warm (its ``dapo serve`` stays a fresh
    process: the served teacher's own start is part of what the bench records)."""
    import subprocess
    from types import SimpleNamespace

    def popen(command: list[str], *args: object, **kwargs: object):
        if command[3:4] == ["train"]:
            return _WarmTrain(command, *args, **kwargs)
        return subprocess.Popen(command, *args, **kwargs)

    return SimpleNamespace(  # type: ignore[return-value]
        Popen=popen,
        PIPE=subprocess.PIPE,
        CalledProcessError=subprocess.CalledProcessError,
        TimeoutExpired=subprocess.TimeoutExpired,
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("bench")
    out, img = tmp / "docs" / "runs" / "distillation", tmp / "docs" / "img"
    argv = ["--teacher-steps", "1", "--steps", "1", "--seeds", "1", "--timing-steps", "2"]
    argv += ["--out", str(out), "--img", str(img), "--work-dir", str(tmp / "work")]
    bench = _script("bench_distillation")
    bench.subprocess = _warm_trains()
    bench.main([*argv, *(a for o in SMALL for a in ("--override", o))])
    return out, img


def _records(folder: Path) -> list[dict]:
    with gzip.open(folder / "metrics.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def _meta(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


@pytest.mark.slow
def test_every_run_is_recorded_with_its_provenance_and_teacher(recorded: tuple[Path, Path]) -> None:
    out, img = recorded
    assert sorted(p.name for p in out.iterdir()) == sorted(RUNS)
    for name in RUNS:
        assert {p.name for p in (out / name).iterdir()} == {"metrics.jsonl.gz", "run.json", "config.yaml"}
        meta = _meta(out / name)
        assert meta["command"].startswith("dapo train") and f"trainer.experiment_name={name}" in meta["command"]
        assert meta["wall_s"] > 0 and meta["commit"] and meta["host_cpu"] and meta["date"]
    teacher = _meta(out / "tiny-pg-opd-s1")["teacher"]
    assert teacher["path"].endswith("tiny-teacher/checkpoints/global_step_1/hf")
    # the teacher's accuracy: its validation of the student's prompts at step 0 of the first PG OPD run
    step0 = _records(out / "tiny-pg-opd-s1")[0]
    assert teacher["val_acc"] == step0[f"distill/teacher/teacher_model/{teacher['val_key']}"]
    assert all(_meta(out / n)["teacher"]["val_acc"] == teacher["val_acc"] for n in RUNS[1:])
    # the arms are what they say: the teacher's signal in the distilled arms only, PG OPD without the reward
    assert "use_task_rewards=false" in _meta(out / "tiny-pg-opd-s1")["command"]
    assert "use_task_rewards=true" in _meta(out / "tiny-opd-reward-s1")["command"]
    assert "distillation" not in _meta(out / "tiny-dapo-s1")["command"]
    for name, distilled in (("tiny-pg-opd-s1", True), ("tiny-opd-reward-s1", True), ("tiny-dapo-s1", False)):
        assert any("distill/reverse_kl" in r for r in _records(out / name)) == distilled
    served = _meta(out / "tiny-teacher-http")
    assert served["teacher"]["url"].startswith("http://127.0.0.1:") and served["teacher"]["serve_command"]
    assert f"model_path={served['teacher']['url']}" in served["command"]
    assert all("timing_s/teacher" in r for r in _records(out / "tiny-teacher-http") if r["step"] >= 1)
    assert (img / "distillation-tiny.png").stat().st_size > 10_000


@pytest.mark.slow
def test_the_measurements_render_from_the_records(recorded: tuple[Path, Path], monkeypatch) -> None:
    out, _ = recorded
    docs = _script("render_docs")
    monkeypatch.setattr(docs, "DISTILLATION_RUNS", str(out))  # ROOT / an absolute path is that path
    table = docs.RENDERERS["distillation-tiny"]()
    for arm, label in docs.DISTILLATION_ARMS.items():
        records = _records(out / f"tiny-{arm}-s1")
        key = _meta(out / "tiny-pg-opd-s1")["teacher"]["val_key"]
        val = [r[key] for r in records if key in r]
        assert f"| {label} | 1 | {val[0]:.3f} → {val[-1]:.3f} |" in table
    timing = docs.RENDERERS["distillation-teacher-timing"]()
    medians = {
        where: statistics.median(r["timing_s/step"] for r in _records(out / f"tiny-teacher-{where}") if r["step"] >= 2)
        for where in ("in-process", "http")
    }
    assert f"**{medians['http'] / medians['in-process']:.2f}x**" in timing
    assert "Not recorded yet for SmolLM2" in docs.RENDERERS["distillation-smollm2"]()


def test_the_smollm2_preset_needs_a_teacher() -> None:
    with pytest.raises(SystemExit):
        _script("bench_distillation").parse(["--preset", "smollm2"])


def test_a_run_past_its_deadline_is_killed_and_named_and_nothing_is_recorded(tmp_path: Path) -> None:
    """The bench's wait on `dapo train` is bounded (--run-deadline-s): past it the run is killed and named."""
    bench_distillation = _script("bench_distillation")
    args = bench_distillation.parse(["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work")])
    args.run_deadline_s = 0.5
    with pytest.raises(SystemExit, match=r"^late: still running after --run-deadline-s=0.5 s, killed$"):
        bench_distillation.Bench(args).train("late", [], what="a run that cannot finish in time", teacher=None)
    assert not (tmp_path / "out" / "late").exists()
