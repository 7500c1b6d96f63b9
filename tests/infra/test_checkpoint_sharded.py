"""The sharded checkpoint format in one process (no process group: DCP's no_dist path, the one a single-process resume
of a multi-rank checkpoint takes): what it writes, exact resume, a multi-file hf/ export, and that neither a failure
nor a SIGKILL between the shard writes and the manifest leaves a complete checkpoint. The multi-rank halves (2 ranks
writing, resharding onto 1 process / another strategy) run under torchrun in
tests/distributed/test_sharded_checkpoint.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from infra_helpers import (
    assert_resumed_run_continues_as,
    assert_same_params,
    make_optimizer,
    tiny_tokenizer,
    train_step,
)
from tests.harness.models import CHECKPOINT, tiny_qwen2
from transformers import Qwen2ForCausalLM

from dapo.config import DapoConfig
from dapo.distributed.fsdp import stream_full_state
from dapo.distributed.world import World
from dapo.infra.checkpoint import (
    CheckpointError,
    find_latest_checkpoint,
    is_complete_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_sharded_checkpoint,
)
from dapo.training.errors import TrainingError
from dapo.training.run_state import checkpoint_format

SRC = Path(__file__).resolve().parents[2] / "src"


def _save_sharded(root: Path, step: int, model, optimizer, scheduler, **kwargs) -> Path:
    kwargs.setdefault("full_tensors", lambda: stream_full_state(model))
    return save_sharded_checkpoint(
        root,
        step,
        world=World(),
        model=model,
        optimizer=optimizer,
        hf_model=model,
        tokenizer=tiny_tokenizer(),
        scheduler=scheduler,
        trainer_state={"step": step},
        **kwargs,
    )


def test_sharded_save_lists_the_dcp_files_in_the_manifest_and_resumes_bit_identically(tmp_path: Path) -> None:
    reference = tiny_qwen2(0, CHECKPOINT)
    ref_opt, ref_sched = make_optimizer(reference)
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    for _ in range(4):
        train_step(reference, ref_opt, ref_sched)

    run = tiny_qwen2(0, CHECKPOINT)
    run_opt, run_sched = make_optimizer(run)
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    for _ in range(2):
        train_step(run, run_opt, run_sched)
    path = _save_sharded(tmp_path, 2, run, run_opt, run_sched)

    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["layout"] == "sharded" and manifest["world_size"] == 1
    files = manifest["files"]
    # The DCP folder (one data file per rank + the metadata) is covered by the same sizes and checksums as the rest;
    # the model and optimizer are not also written whole.
    assert {
        "sharded/.metadata",
        "sharded/__0_0.distcp",
        "rng_rank0.pt",
        "hf/model.safetensors",
        "scheduler.pt",
        "trainer_state.json",
    } <= files.keys()
    assert "optimizer.pt" not in files and "rng.pt" not in files
    assert all(len(meta["sha256"]) == 64 for meta in files.values())
    assert find_latest_checkpoint(tmp_path) == path

    # Resumed into other weights, a fresh optimizer and moved RNG streams: the continuation is bit-identical.
    random.random(), torch.rand(3)
    assert_resumed_run_continues_as(path, reference, steps=2)


def test_hf_export_streams_into_several_files_that_from_pretrained_loads(tmp_path: Path) -> None:
    model = tiny_qwen2(3, CHECKPOINT)
    optimizer, scheduler = make_optimizer(model)
    train_step(model, optimizer, scheduler)
    # A shard limit below one layer's weights: every file holds a few tensors, as a 7B model's 2 GiB files would.
    path = _save_sharded(tmp_path / "sharded", 1, model, optimizer, scheduler, max_shard_bytes=4096)
    weights = sorted(p.name for p in (path / "hf").glob("*.safetensors"))
    assert len(weights) > 2 and weights[0] == f"model-00001-of-{len(weights):05d}.safetensors"
    index = json.loads((path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(weights)
    assert_same_params(model, Qwen2ForCausalLM.from_pretrained(path / "hf"))

    # The same tensors under the same names as save_pretrained's export (the tied LM head left out of both).
    full = save_checkpoint(
        tmp_path / "full", 1, model=model, tokenizer=None, optimizer=optimizer, scheduler=scheduler, trainer_state={}
    )
    from safetensors.torch import load_file

    ours = {k: v for f in weights for k, v in load_file(path / "hf" / f).items()}
    theirs = load_file(full / "hf" / "model.safetensors")
    assert ours.keys() == theirs.keys() and "lm_head.weight" not in ours
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_a_changed_shard_file_is_refused(tmp_path: Path) -> None:
    model = tiny_qwen2(4, CHECKPOINT)
    optimizer, scheduler = make_optimizer(model)
    train_step(model, optimizer, scheduler)
    path = _save_sharded(tmp_path, 1, model, optimizer, scheduler)
    shard = path / "sharded" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other content: only the checksum tells
    shard.write_bytes(bytes(data))
    assert is_complete_checkpoint(path) and find_latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match=r"sharded/__0_0\.distcp does not match its checksum"):
        load_checkpoint(path, model=tiny_qwen2(5, CHECKPOINT), optimizer=None, scheduler=None)


def test_a_failure_after_the_shards_removes_the_partial_folder_and_keeps_the_previous(tmp_path: Path) -> None:
    model = tiny_qwen2(6, CHECKPOINT)
    optimizer, scheduler = make_optimizer(model)
    train_step(model, optimizer, scheduler)
    first = _save_sharded(tmp_path, 1, model, optimizer, scheduler)

    def gathering_fails():
        yield from list(stream_full_state(model))[:2]
        raise RuntimeError("an all-gather failed")

    with pytest.raises(
        CheckpointError,
        match=r"an all-gather failed while gathering the full weights for hf/ for "
        r"step 2; previous checkpoint global_step_1 is intact",
    ):
        _save_sharded(tmp_path, 2, model, optimizer, scheduler, full_tensors=gathering_fails)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "latest_checkpointed_iteration.txt"]
    assert find_latest_checkpoint(tmp_path) == first


# The worker saves step 1, then starts step 2 and stops inside the hf/ export: its shards, RNG file and first weight
# file are written, the manifest is not. The test SIGKILLs it there.
_CRASH_WORKER = """
import sys, time
from pathlib import Path
from infra_helpers import make_optimizer, tiny_tokenizer, train_step
from tests.harness.models import CHECKPOINT, tiny_qwen2
from dapo.distributed.fsdp import stream_full_state
from dapo.distributed.world import World
from dapo.infra.checkpoint import save_sharded_checkpoint

root, reached = Path(sys.argv[1]), Path(sys.argv[2])
model = tiny_qwen2(8, CHECKPOINT)
optimizer, scheduler = make_optimizer(model)
train_step(model, optimizer, scheduler)

def save(step, tensors):
    save_sharded_checkpoint(root, step, world=World(), model=model, optimizer=optimizer, full_tensors=tensors,
                            hf_model=model, tokenizer=tiny_tokenizer(), scheduler=scheduler,
                            trainer_state={"step": step}, max_shard_bytes=1)

def hangs_mid_export():
    for i, item in enumerate(stream_full_state(model)):
        if i == 2:
            reached.touch()
            time.sleep(300)
        yield item

save(1, lambda: stream_full_state(model))
train_step(model, optimizer, scheduler)
save(2, hangs_mid_export)
"""


def test_sigkill_between_the_shard_writes_and_the_manifest_leaves_no_complete_checkpoint(tmp_path: Path) -> None:
    root, reached = tmp_path / "checkpoints", tmp_path / "reached"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    paths = [str(SRC), str(SRC.parent), str(Path(__file__).parent), env.get("PYTHONPATH", "")]  # dapo, tests, helpers
    env["PYTHONPATH"] = os.pathsep.join(paths)
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASH_WORKER, str(root), str(reached)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not reached.exists():
            if child.poll() is not None:
                pytest.fail(f"worker exited ({child.returncode}) before the crash point: {child.stderr.read()}")
            assert time.monotonic() < deadline, "the worker never reached the crash point"
            time.sleep(0.05)
        (temp,) = [p for p in root.iterdir() if p.name.startswith(".tmp-global_step_2")]
        before_kill = sorted(p.relative_to(temp).as_posix() for p in temp.rglob("*") if p.is_file())
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()
    # The kill really landed after the shards: every rank's data and the DCP metadata were on disk, no manifest.
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "rng_rank0.pt"} <= set(before_kill)
    assert "manifest.json" not in before_kill
    assert not (root / "global_step_2").exists()
    assert find_latest_checkpoint(root) == root / "global_step_1"
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert load_checkpoint(root / "global_step_1", model=tiny_qwen2(9, CHECKPOINT), optimizer=None, scheduler=None) == {
        "step": 1
    }

    # The next save clears the dead process's temp folder and completes.
    model = tiny_qwen2(8, CHECKPOINT)
    optimizer, scheduler = make_optimizer(model)
    second = _save_sharded(root, 2, model, optimizer, scheduler)
    assert sorted(p.name for p in root.iterdir()) == [
        "global_step_1",
        "global_step_2",
        "latest_checkpointed_iteration.txt",
    ]
    assert find_latest_checkpoint(root) == second


def test_auto_format_is_sharded_only_for_an_fsdp2_actor() -> None:
    model = tiny_qwen2(0, CHECKPOINT)  # a replica: its whole state already is on rank 0
    assert checkpoint_format(DapoConfig(), model) == "full"
    assert checkpoint_format(DapoConfig(trainer={"checkpoint_format": "full"}), model) == "full"
    with pytest.raises(TrainingError, match="trainer.checkpoint_format=sharded .* needs actor.strategy=fsdp2"):
        checkpoint_format(DapoConfig(trainer={"checkpoint_format": "sharded"}), model)
