"""Checkpoint rotation (``keep_last`` / ``trainer.max_ckpt_to_keep``) as a property, on real folders.

The property tests build checkpoints the cheap way (one small file each, with the manifest
``dapo.infra.checkpoint`` writes: size and SHA-256), so hypothesis can try hundreds of (keep, count, corrupt)
combinations in a second; one test saves real checkpoints of a tiny model to cover ``save_checkpoint``'s own call.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from infra_helpers import make_optimizer, tiny_tokenizer, train_step

from dapo.infra.checkpoint import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    find_latest_checkpoint,
    rotate_checkpoints,
    save_checkpoint,
)
from tests.harness.models import CHECKPOINT, tiny_qwen2


def _fake_checkpoint(root: Path, step: int) -> Path:
    """A folder ``find_latest_checkpoint`` accepts: one file plus a manifest with its size and checksum."""
    folder = root / f"global_step_{step}"
    folder.mkdir(parents=True)
    data = f"weights of step {step}".encode()
    (folder / "weights.bin").write_bytes(data)
    manifest = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "files": {"weights.bin": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    return folder


def _corrupt(folder: Path) -> None:
    """Same size, other content: complete by size, fails verification (bit rot)."""
    path = folder / "weights.bin"
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


def _steps(root: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("global_step_")) for p in root.iterdir() if p.name.startswith("global_"))


@settings(max_examples=300, deadline=None)
@given(keep=st.integers(1, 12), count=st.integers(1, 14))
def test_a_run_saving_step_after_step_keeps_exactly_the_newest_keep(keep: int, count: int) -> None:
    # The reported case: keep=5 with 4 checkpoints deleted steps 1 and 2 (a negative slice).
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for step in range(1, count + 1):
            _fake_checkpoint(root, step)
            rotate_checkpoints(root, step, keep)
            assert _steps(root) == list(range(max(1, step - keep + 1), step + 1)), (keep, step)


@settings(max_examples=300, deadline=None)
@given(keep=st.integers(1, 12), older=st.integers(0, 14), data=st.data())
def test_a_checkpoint_that_fails_to_verify_never_takes_the_place_of_a_good_one(
    keep: int, older: int, data: st.DataObject
) -> None:
    corrupt = data.draw(st.sets(st.integers(1, older)) if older else st.just(set()), label="corrupt")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for step in range(1, older + 1):
            folder = _fake_checkpoint(root, step)
            if step in corrupt:
                _corrupt(folder)
        new = older + 1
        _fake_checkpoint(root, new)
        rotate_checkpoints(root, new, keep)

        good = [s for s in range(1, new + 1) if s not in corrupt]
        remaining = _steps(root)
        remaining_good = [s for s in remaining if s not in corrupt]
        assert remaining_good == good[-keep:]  # exactly min(keep, #good) newest good ones, the new one included
        kept_corrupt = [s for s in remaining if s in corrupt]
        if len(remaining_good) == keep:  # a full quota: no failed one older than all the good ones survives
            assert all(s > remaining_good[0] for s in kept_corrupt)
        assert find_latest_checkpoint(root) == root / f"global_step_{new}"


def test_a_newer_checkpoint_than_the_saved_one_is_never_deleted(tmp_path: Path) -> None:
    for step in (1, 2, 9):
        _fake_checkpoint(tmp_path, step)
    _fake_checkpoint(tmp_path, 3)
    rotate_checkpoints(tmp_path, 3, 1)
    assert _steps(tmp_path) == [3, 9]


def test_save_checkpoint_with_keep_5_keeps_every_checkpoint_until_the_sixth(tmp_path: Path) -> None:
    model = tiny_qwen2(0, CHECKPOINT)
    optimizer, scheduler = make_optimizer(model)
    train_step(model, optimizer, scheduler)
    for step in range(1, 7):
        save_checkpoint(
            tmp_path,
            step,
            model=model,
            tokenizer=tiny_tokenizer(),
            optimizer=optimizer,
            scheduler=scheduler,
            trainer_state={"step": step},
            keep_last=5,
        )
        assert _steps(tmp_path) == list(range(max(1, step - 4), step + 1))
    shutil.rmtree(tmp_path / "global_step_6")
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_5"
