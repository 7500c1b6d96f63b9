"""`dapo train` with multi-turn tool rollouts (configs/tools/tiny_calculator.yaml: the tiny model's "a + b =" lines are
computed by the sandboxed interpreter), through the real CLI on both engines, and a run whose every tool call is
hostile code.

What the runs prove beyond finishing: the tool ran (tool/* metrics), and the actor-vs-engine log-prob gap, measured
over the model's tokens only, is the single-turn one (< 1e-4): were tool tokens (whose rollout log-prob is a 0.0
placeholder) not masked, it would be of order 1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from dapo.config import load_config
from dapo.rollout.factory import engine_available
from dapo.tools.sandbox import PythonSandbox, ToolResult
from dapo.tools import python_tool
from dapo.training.loop import train
from tests.cli.cli_helpers import FAST
from tests.harness.runners import run_dapo_warm

PRESET = str(Path(__file__).resolve().parents[2] / "configs" / "tools" / "tiny_calculator.yaml")
SMALL = [
    *FAST,
    "data.max_response_length=64",
    "algorithm.filter_groups.max_num_gen_batches=1",
    "rollout.multi_turn.sandbox.mode=unsafe-no-isolation",
    "trainer.total_training_steps=1",
    "data.val_max_samples=2",
]


def records_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_tool_run(run_dir: Path) -> None:
    steps = [r for r in records_of(run_dir) if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1]
    for r in steps:
        assert r["tool/calls_per_sample"] > 0.5 and r["tool/samples_with_call"] > 0.5, r
        assert r["tool/result/ok"] == r["tool/calls"]  # "a + b" always evaluates
        if "rollout/log_prob_diff/mean" in r:
            assert r["rollout/log_prob_diff/mean"] < 1e-4, r
    assert any("rollout/log_prob_diff/mean" in r for r in steps)


@pytest.mark.slow
@pytest.mark.skipif(not engine_available("vllm")[0], reason=engine_available("vllm")[1])
def test_multi_turn_training_runs_and_the_mask_lines_up_log_probs_vllm_cli(tmp_path: Path) -> None:
    """`dapo train --config <tools preset>` as a user runs it: a real process (forked from the warm server,
    tests/harness/runners.py), the vLLM engine."""
    proc = run_dapo_warm(
        ["train", "--config", PRESET, *SMALL, "rollout.name=vllm", "trainer.experiment_name=t"], tmp_path, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_tool_run(tmp_path / "t")


@pytest.mark.slow
def test_multi_turn_training_runs_and_the_mask_lines_up_log_probs_hf(tmp_path: Path) -> None:
    """The same run on the Transformers engine, in this process (the preset, the CLI's path to train() and the tool
    sandbox's processes are the same; the subprocess start-up is the vLLM test's)."""
    cfg = load_config(
        PRESET,
        [
            *SMALL,
            "rollout.name=hf",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.experiment_name=t",
            "trainer.progress=false",
        ],
    )
    assert train(cfg).steps_done == 1
    _check_tool_run(tmp_path / "t")


@pytest.mark.slow
def test_multi_turn_training_runs_one_step_off(tmp_path: Path) -> None:
    """The tools preset under async_training.mode=one_step_off: the batch generated ahead is tagged with the wrapped
    engine's weight version (it stopped with "'MultiTurnRollout' object has no attribute 'weight_version'"), the
    tool ran, and every sample lags at most one version."""
    cfg = load_config(
        PRESET,
        [
            *SMALL,
            "trainer.total_training_steps=2",
            "async_training.mode=one_step_off",
            "async_training.rollout_num_threads=1",
            "rollout.name=hf",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.experiment_name=t",
            "trainer.progress=false",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
        ],
    )
    assert train(cfg).steps_done == 2
    steps = [r for r in records_of(tmp_path / "t") if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["tool/calls"] > 0, r
        assert r["async/staleness/max"] <= 1, r
        # the overlap's train interval wraps the timer's "train" phase: a few ms wider at most
        assert 0.0 <= r["async/overlap_s"] <= r["timing_s/train"] + 0.05, r


class HostileSandbox(PythonSandbox):
    """The real sandbox, running hostile programs in place of what the model wrote (the tiny model cannot be made to
    write them on demand)."""

    PROGRAMS = (
        "while True:\n    pass",
        "import os\nwhile True:\n    os.fork()",
        "x = bytearray(1 << 40)",
        "while True:\n    print('y' * 4096)",
        "print(open('/etc/passwd').read())",
        "open('/tmp/dapo-train-escape', 'w').write('x')",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
        "import os\nos._exit(7)",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    )
    calls = 0

    def run_many(self, codes: Sequence[str], max_workers: int = 4) -> list[ToolResult]:
        programs = [self.PROGRAMS[(HostileSandbox.calls + i) % len(self.PROGRAMS)] for i in range(len(codes))]
        HostileSandbox.calls += len(codes)
        return super().run_many(programs, max_workers=max_workers)


@pytest.mark.slow
def test_a_run_whose_every_tool_call_is_hostile_still_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(python_tool, "PythonSandbox", HostileSandbox)
    cfg = load_config(
        PRESET,
        [
            *SMALL,
            "trainer.val_before_train=false",
            "rollout.multi_turn.sandbox.wall_time_s=1.5",
            "rollout.multi_turn.sandbox.cpu_time_s=1",
            "rollout.multi_turn.sandbox.max_output_bytes=2048",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.experiment_name=h",
            "trainer.progress=false",
        ],
    )
    result = train(cfg)
    assert result.steps_done == 1
    step = next(r for r in records_of(tmp_path / "h") if r["step"] == 1)
    assert HostileSandbox.calls >= len(HostileSandbox.PROGRAMS)
    assert step["tool/result/ok"] == 0 and step["tool/errors"] == step["tool/calls"] > 0
    for category in ("timeout", "memory", "output_limit", "error"):
        assert step[f"tool/result/{category}"] > 0, step
    assert not Path("/tmp/dapo-train-escape").exists()
