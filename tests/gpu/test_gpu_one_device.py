"""The GPU paths that one CUDA device runs without vLLM: `dapo train` on CUDA with the Transformers engine, in fp32 and
with a bf16 actor, and the efficiency metrics against the device's datasheet peak.

They skip here (no CUDA device). On a lent one-GPU machine without vLLM (the device image) these are the GPU tests
that run; tests/gpu/test_gpu_paths.py's need vLLM or two GPUs (scripts/gpu_check.sh lists them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dapo.infra.perf import datasheet_peak
from tests.cli.cli_helpers import FAST
from tests.harness.runners import run_dapo
from tests.gpu.test_gpu_paths import needs_gpu


def train_on_cuda(tmp_path: Path, *overrides: str) -> list[dict]:
    proc = run_dapo(
        ["train", *FAST, "trainer.device=cuda", *overrides],
        tmp_path,
        timeout=600,
        extra_env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = (tmp_path / "tiny-synth" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["step"] > 0]


@needs_gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_train_on_cuda_with_the_transformers_engine(tmp_path: Path, dtype: str) -> None:
    steps = train_on_cuda(tmp_path, f"actor.dtype={dtype}")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["rollout/num_tokens"] > 0 and torch.isfinite(torch.tensor(r["actor/pg_loss"]))
        assert r["perf/max_memory_allocated_gb"] > 0  # the CUDA allocator's peak, logged per phase
        # MFU against the datasheet peak of this GPU in the actor's precision, or a probe where it is not in the table
        known = datasheet_peak(torch.cuda.get_device_name(), dtype)
        if known is not None:
            assert r["perf/peak_flops/actor"] == pytest.approx(known.flops_per_s)
        assert 0 < r["perf/mfu/actor"] < 1 and 0 < r["perf/mfu/rollout"] < 1
