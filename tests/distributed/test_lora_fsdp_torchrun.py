"""LoRA under actor.strategy=fsdp2: real `dapo train` on 2 torchrun ranks (gloo on CPU) trains the same adapters as
the replicated LoRA actor on 2 ranks, saves them as a full adapter folder, and resumes from it.

The two strategies run the same samples (per-prompt seeds) and sum the same gradients, so their adapters agree up to
float rounding. A sharded push or save (each rank's half of a factor), or gradients not summed over ranks, would
differ by far more: B starts at zero, so a missing rank's gradient halves its first update."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.distributed.test_train_torchrun import SMALL
from tests.harness.runners import torchrun_warm

ARGS = [*SMALL, "model.lora_rank=8", "model.lora_alpha=16", "trainer.save_freq=1", "trainer.progress=false"]


def _train(tmp_path: Path, name: str, strategy: str, steps: int) -> str:
    """The run's stdout."""
    args = [*ARGS, f"actor.strategy={strategy}", f"trainer.total_training_steps={steps}"]
    run = torchrun_warm([*args, f"trainer.experiment_name={name}"], tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    return run.stdout


def _adapters(tmp_path: Path, name: str, step: int) -> dict:
    return load_file(tmp_path / name / "checkpoints" / f"global_step_{step}" / "hf" / "adapter_model.safetensors")


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and any(".lora_B." in k for k in a)
    for key in a:
        assert a[key].shape == b[key].shape, key  # full tensors, not one rank's shard
        assert float((a[key] - b[key]).abs().max()) <= 1e-5, key


@pytest.mark.slow
def test_fsdp2_lora_trains_saves_and_resumes_the_adapters_of_replicated_lora(tmp_path: Path) -> None:
    for strategy in ("replicated", "fsdp2"):
        _train(tmp_path, strategy, strategy, steps=2)
    replicated, sharded = _adapters(tmp_path, "replicated", 2), _adapters(tmp_path, "fsdp2", 2)
    _assert_same(replicated, sharded)
    assert any(float(t.abs().max()) > 0 for k, t in sharded.items() if ".lora_B." in k)  # trained away from B = 0
    # The merged model beside the adapter folder, as the replicated actor writes it.
    merged = tmp_path / "fsdp2" / "checkpoints" / "global_step_2" / "hf" / "merged" / "model.safetensors"
    assert merged.exists()

    # A third step resumed from each run's step-2 checkpoint (adapters and their AdamW state scattered back into
    # the shards) still agrees.
    # the runs resumed (a run that started over would also agree)
    for strategy in ("replicated", "fsdp2"):
        out = _train(tmp_path, strategy, strategy, steps=3)
        assert "resumed from" in out and "(step 2)" in out, out[-2000:]
    _assert_same(_adapters(tmp_path, "replicated", 3), _adapters(tmp_path, "fsdp2", 3))
