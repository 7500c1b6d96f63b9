"""Subprocess side of the full-disk and crash checkpoint tests: ``python checkpoint_worker.py ROOT GO REACHED``.

One process does both phases (importing torch + transformers twice would double the test time):

1. full disk: with RLIMIT_FSIZE set (SIGXFSZ ignored, so writes fail with EFBIG as on a full disk) it
   tries to save step 2 twice - once failing in optimizer.pt, once in the hf/ weights - and prints the
   CheckpointError messages as one JSON line; then it lifts the limit and waits for the file GO, so the
   test can inspect the checkpoint folder in between.
2. crash: it starts saving step 2 again and, once hf/ is written into the temp folder, touches REACHED
   and hangs until the test SIGKILLs it, so the kill deterministically lands mid-save.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from infra_helpers import make_optimizer, tiny_tokenizer, train_step

from dapo.infra.checkpoint import CheckpointError, save_checkpoint
from tests.harness.models import CHECKPOINT, tiny_qwen2


def _wait_for(ready: Callable[[], bool], *, what: str, limit_s: float = 300.0) -> None:
    """Poll ``ready``; give up (exit status 1) after ``limit_s`` so an orphaned worker never lingers."""
    deadline = time.monotonic() + limit_s
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"checkpoint_worker: gave up waiting for {what}")
        time.sleep(0.02)


class AdamWThatHangsOnSave(torch.optim.AdamW):
    """A real AdamW whose ``state_dict`` (called mid-save, after hf/ is written) signals and then hangs."""

    reached_file: Path

    def state_dict(self) -> dict[str, Any]:
        self.reached_file.write_text("saving optimizer.pt\n")
        _wait_for(lambda: False, what="SIGKILL from the test")
        raise AssertionError("unreachable")


def crash(root: Path, reached: Path) -> None:
    model = tiny_qwen2(2, CHECKPOINT)
    optimizer = AdamWThatHangsOnSave(model.parameters(), lr=1e-2)
    optimizer.reached_file = reached
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    save_checkpoint(
        root,
        2,
        model=model,
        tokenizer=tiny_tokenizer(),
        optimizer=optimizer,
        scheduler=scheduler,
        trainer_state={"step": 2},
    )


def full_disk(root: Path) -> None:
    model = tiny_qwen2(3, CHECKPOINT, hidden_size=64, intermediate_size=128, vocab_size=512)
    optimizer, scheduler = make_optimizer(model)
    train_step(model, optimizer, scheduler)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied params counted once
    # optimizer.pt holds exp_avg + exp_avg_sq (2x the weights): 1.4x lets hf/ through and stops optimizer.pt;
    # 0.5x already stops the safetensors weights.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    messages = []
    for limit in (int(weight_bytes * 1.4), weight_bytes // 2):
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            save_checkpoint(
                root,
                2,
                model=model,
                tokenizer=tiny_tokenizer(),
                optimizer=optimizer,
                scheduler=scheduler,
                trainer_state={"step": 2},
            )
        except CheckpointError as exc:
            messages.append(str(exc))
        else:
            messages.append(None)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    print(json.dumps({"weight_bytes": weight_bytes, "messages": messages}), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    checkpoint_root, go_file, reached_file = (Path(arg) for arg in sys.argv[1:4])
    full_disk(checkpoint_root)
    _wait_for(go_file.exists, what=f"{go_file} from the test")
    crash(checkpoint_root, reached_file)
