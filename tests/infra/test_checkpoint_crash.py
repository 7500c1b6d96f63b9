"""A real write-size limit (full disk) and a real SIGKILL mid-save never lose the previous checkpoint.

Both scenarios run in one worker process (see checkpoint_worker.py) to pay the torch + transformers
import once; the module fixture drives it and records what the test process observes at each phase.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from infra_helpers import make_optimizer, tiny_tokenizer, train_step

from dapo.infra.checkpoint import find_latest_checkpoint, is_complete_checkpoint, load_checkpoint, save_checkpoint
from tests.harness.models import CHECKPOINT, tiny_qwen2

WORKER = Path(__file__).with_name("checkpoint_worker.py")
SRC = Path(__file__).resolve().parents[2] / "src"


@dataclass
class Observed:
    root: Path
    model: torch.nn.Module  # the weights saved as step 1
    first: Path
    full_disk_messages: list[str | None]
    after_full_disk: list[str]  # folder listing once both failed saves returned
    temp_before_kill: list[str]  # files in the temp folder when the kill was sent
    kill_returncode: int
    after_kill: list[str]


def _listing(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    work = tmp_path_factory.mktemp("crash")
    root = work / "checkpoints"
    model = tiny_qwen2(1, CHECKPOINT)
    optimizer, scheduler = make_optimizer(model)
    train_step(model, optimizer, scheduler)
    first = save_checkpoint(
        root,
        1,
        model=model,
        tokenizer=tiny_tokenizer(),
        optimizer=optimizer,
        scheduler=scheduler,
        trainer_state={"step": 1},
    )
    go, reached = work / "go", work / "reached"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    paths = (str(SRC), str(SRC.parent), env.get("PYTHONPATH", ""))  # dapo, and the repository root for tests.harness
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    stderr_path = work / "worker.stderr"  # a file, not a pipe: a full pipe would block the worker
    stderr_file = open(stderr_path, "w")  # noqa: SIM115 - closed in finally
    child = subprocess.Popen(
        [sys.executable, str(WORKER), str(root), str(go), str(reached)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        text=True,
    )
    try:
        line = child.stdout.readline()  # phase 1 report; blocks until the worker printed it
        if not line:
            pytest.fail(f"worker died in the full-disk phase: {stderr_path.read_text()}")
        messages = json.loads(line)["messages"]
        after_full_disk = _listing(root)
        go.touch()
        while not reached.exists():  # phase 2: the worker is inside save_checkpoint
            try:
                child.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"worker exited ({child.returncode}) before the crash point: {stderr_path.read_text()}")
        temps = [p for p in root.iterdir() if p.name.startswith(".tmp-global_step_2")]
        temp_files = sorted(str(p.relative_to(temps[0])) for p in temps[0].rglob("*")) if len(temps) == 1 else []
        os.kill(child.pid, signal.SIGKILL)
        returncode = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        stderr_file.close()
    yield Observed(root, model, first, messages, after_full_disk, temp_files, returncode, _listing(root))


def _assert_loads_step_one(obs: Observed) -> None:
    assert find_latest_checkpoint(obs.root) == obs.first and is_complete_checkpoint(obs.first)
    fresh = tiny_qwen2(50, CHECKPOINT)
    opt, sched = make_optimizer(fresh)
    assert load_checkpoint(obs.first, model=fresh, optimizer=opt, scheduler=sched) == {"step": 1}
    for a, b in zip(obs.model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_full_disk_raises_checkpoint_error_and_keeps_previous(observed: Observed) -> None:
    in_optimizer, in_weights = observed.full_disk_messages
    for message, where in ((in_optimizer, "optimizer.pt"), (in_weights, "hf/ (model weights and config)")):
        assert message is not None, f"save did not fail while writing {where}"
        assert message.startswith(f"file size limit exceeded (file too large) while writing {where} for step 2;")
        assert "previous checkpoint global_step_1 is intact" in message
    # no temp folder, no step 2, pointer unchanged
    assert observed.after_full_disk == ["global_step_1", "latest_checkpointed_iteration.txt"]
    _assert_loads_step_one(observed)


def test_sigkill_mid_save_keeps_previous_checkpoint(observed: Observed) -> None:
    assert "hf/model.safetensors" in observed.temp_before_kill  # the kill really landed mid-save
    assert "manifest.json" not in observed.temp_before_kill
    assert observed.kill_returncode == -signal.SIGKILL
    assert "global_step_2" not in observed.after_kill
    assert (observed.root / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    _assert_loads_step_one(observed)

    # The next save removes the dead process's temp folder and completes normally.
    optimizer, scheduler = make_optimizer(observed.model)
    second = save_checkpoint(
        observed.root,
        2,
        model=observed.model,
        tokenizer=None,
        optimizer=optimizer,
        scheduler=scheduler,
        trainer_state={"step": 2},
    )
    assert _listing(observed.root) == ["global_step_1", "global_step_2", "latest_checkpointed_iteration.txt"]
    assert find_latest_checkpoint(observed.root) == second
