"""Checkpoints are verified by a checksum per file: a file that kept its size but not its content is never loaded,
and the newest checkpoint that verifies is used instead, with a warning naming the one skipped and why."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from infra_helpers import make_optimizer, tiny_tokenizer, train_step

from dapo.infra.checkpoint import (
    CheckpointError,
    checkpoint_problems,
    find_latest_checkpoint,
    is_complete_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from tests.harness.models import CHECKPOINT, tiny_qwen2


def _same_length_garbage(path: Path) -> None:
    path.write_bytes(b"#" * path.stat().st_size)


def _overwrite_header(path: Path) -> None:  # safetensors: the first 8 bytes are the header length
    with open(path, "r+b") as f:
        f.write(b"\xff" * 8)


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


CORRUPTIONS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "trainer_state.json garbage of the same length": ("trainer_state.json", _same_length_garbage),
    "safetensors header overwritten": ("hf/model.safetensors", _overwrite_header),
    "one bit of the weights flipped": ("hf/model.safetensors", _flip_middle_byte),
    "one bit of optimizer.pt flipped": ("optimizer.pt", _flip_middle_byte),
    "rng.pt garbage of the same length": ("rng.pt", _same_length_garbage),
    "scheduler.pt garbage of the same length": ("scheduler.pt", _same_length_garbage),
    "manifest.json garbage": ("manifest.json", _same_length_garbage),
}


@pytest.fixture
def two_checkpoints(tmp_path: Path):
    model = tiny_qwen2(0, CHECKPOINT)
    optimizer, scheduler = make_optimizer(model)
    paths = []
    for step in (1, 2):
        train_step(model, optimizer, scheduler)
        paths.append(
            save_checkpoint(
                tmp_path,
                step,
                model=model,
                tokenizer=tiny_tokenizer(),
                optimizer=optimizer,
                scheduler=scheduler,
                trainer_state={"step": step},
            )
        )
    return tmp_path, paths, model, optimizer, scheduler


def test_manifest_records_a_checksum_per_file(two_checkpoints) -> None:
    _root, (_first, second), *_ = two_checkpoints
    files = json.loads((second / "manifest.json").read_text())["files"]
    assert {"trainer_state.json", "optimizer.pt", "rng.pt", "hf/model.safetensors"} <= files.keys()
    assert all(len(meta["sha256"]) == 64 for meta in files.values())


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupted_newest_checkpoint_falls_back_to_the_previous_one(
    two_checkpoints, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    root, (first, second), model, optimizer, scheduler = two_checkpoints
    rel, corrupt = CORRUPTIONS[kind]
    corrupt(second / rel)
    with caplog.at_level(logging.WARNING, logger="dapo.infra.checkpoint"):
        assert find_latest_checkpoint(root) == first
    assert "global_step_2" in caplog.text
    assert second in checkpoint_problems(root) and first not in checkpoint_problems(root)
    with pytest.raises(CheckpointError, match="global_step_2"):
        load_checkpoint(second, model=model, optimizer=optimizer, scheduler=scheduler)
    assert load_checkpoint(first, model=model, optimizer=optimizer, scheduler=scheduler)["step"] == 1


def test_the_reason_names_the_file(two_checkpoints, caplog: pytest.LogCaptureFixture) -> None:
    root, (first, second), model, optimizer, scheduler = two_checkpoints
    _same_length_garbage(second / "trainer_state.json")
    assert is_complete_checkpoint(second)  # sizes still match: only the checksum tells
    with caplog.at_level(logging.WARNING, logger="dapo.infra.checkpoint"):
        find_latest_checkpoint(root)
    assert "skipping checkpoint" in caplog.text and "trainer_state.json does not match its checksum" in caplog.text
    with pytest.raises(CheckpointError, match=r"trainer_state.json does not match its checksum"):
        load_checkpoint(second, model=model, optimizer=optimizer, scheduler=scheduler)


def test_every_checkpoint_corrupted_finds_none_and_lists_why(two_checkpoints) -> None:
    root, paths, *_ = two_checkpoints
    for path in paths:
        _overwrite_header(path / "hf" / "model.safetensors")
    assert find_latest_checkpoint(root) is None
    problems = checkpoint_problems(root)
    assert sorted(p.name for p in problems) == ["global_step_1", "global_step_2"]
    assert all("hf/model.safetensors" in why for why in problems.values())


def test_a_checkpoint_without_checksums_still_loads_and_fails_cleanly(two_checkpoints) -> None:
    # Manifests written before checksums existed: verified by size only; a damaged file is a CheckpointError
    # naming it, never a raw JSONDecodeError or SafetensorError.
    root, (first, second), model, optimizer, scheduler = two_checkpoints
    for path in (first, second):
        manifest = json.loads((path / "manifest.json").read_text())
        for meta in manifest["files"].values():
            del meta["sha256"]
        (path / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    assert find_latest_checkpoint(root) == second
    assert load_checkpoint(second, model=model, optimizer=optimizer, scheduler=scheduler)["step"] == 2
    _same_length_garbage(second / "trainer_state.json")
    with pytest.raises(CheckpointError, match=r"cannot read .*trainer_state.json"):
        load_checkpoint(second, model=model, optimizer=optimizer, scheduler=scheduler)
    _overwrite_header(first / "hf" / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"cannot read .*model.safetensors"):
        load_checkpoint(first, model=model, optimizer=optimizer, scheduler=scheduler)
