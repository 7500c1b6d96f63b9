"""Save / load / resume / rotation of dapo.infra.checkpoint with a real tiny Qwen2 model and AdamW."""

from __future__ import annotations

import json
import logging
import math
import random
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
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from dapo.infra.checkpoint import (
    LATEST_FILE_NAME,
    CheckpointError,
    find_latest_checkpoint,
    is_complete_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from tests.harness.models import CHECKPOINT, tiny_qwen2


def _trained(seed: int = 0, steps: int = 1):
    model = tiny_qwen2(seed, CHECKPOINT)
    optimizer, scheduler = make_optimizer(model)
    for _ in range(steps):
        train_step(model, optimizer, scheduler)
    return model, optimizer, scheduler


def _save(root: Path, step: int, model, optimizer, scheduler, state=None, **kwargs) -> Path:
    return save_checkpoint(
        root,
        step,
        model=model,
        tokenizer=tiny_tokenizer(),
        optimizer=optimizer,
        scheduler=scheduler,
        trainer_state=state if state is not None else {"step": step},
        **kwargs,
    )


def _rng_draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_round_trip_restores_weights_optimizer_scheduler_rng_and_state(tmp_path: Path) -> None:
    model, optimizer, scheduler = _trained(seed=0, steps=2)
    state = {
        "step": 2,
        "data_loader": {"epoch": 0, "position": 17, "seed": 1},
        "carry": [{"uid": "a", "rewards": [1.0, -1.0]}],
        "as_tuple": (1, 2),  # not JSON-exact -> trainer_state.pt
        "pending_tokens": torch.arange(5),
        "int_keys": {3: "x"},
        "nan_metric": math.nan,
    }
    path = _save(tmp_path, 2, model, optimizer, scheduler, state)
    expected_draws = _rng_draws()

    assert path == tmp_path / "global_step_2"
    assert (tmp_path / LATEST_FILE_NAME).read_text().strip() == "2"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 2
    assert {
        "hf/model.safetensors",
        "hf/config.json",
        "hf/tokenizer.json",
        "optimizer.pt",
        "scheduler.pt",
        "rng.pt",
        "trainer_state.json",
        "trainer_state.pt",
    } <= set(manifest["files"])
    for rel, meta in manifest["files"].items():
        assert (path / rel).stat().st_size == meta["size"]
    assert json.loads((path / "trainer_state.json").read_text()) == {
        "step": 2,
        "data_loader": {"epoch": 0, "position": 17, "seed": 1},
        "carry": [{"uid": "a", "rewards": [1.0, -1.0]}],
    }

    other = tiny_qwen2(99, CHECKPOINT)
    other_opt, other_sched = make_optimizer(other)
    restored = load_checkpoint(path, model=other, optimizer=other_opt, scheduler=other_sched)

    assert_same_params(model, other)
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()  # still tied
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        sp, sq = optimizer.state[p], other_opt.state[q]
        assert sp.keys() == sq.keys()
        for key in sp:
            assert torch.equal(sp[key], sq[key]), key
    assert other_opt.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    assert other_sched.state_dict()["last_epoch"] == scheduler.state_dict()["last_epoch"] == 2
    assert _rng_draws() == expected_draws

    assert restored.keys() == state.keys()
    assert restored["as_tuple"] == (1, 2) and isinstance(restored["as_tuple"], tuple)
    assert torch.equal(restored["pending_tokens"], torch.arange(5))
    assert restored["int_keys"] == {3: "x"}
    assert math.isnan(restored["nan_metric"])
    assert restored["carry"] == state["carry"] and restored["data_loader"] == state["data_loader"]


def test_hf_folder_loads_with_from_pretrained(tmp_path: Path) -> None:
    model, optimizer, scheduler = _trained(seed=1)
    path = _save(tmp_path, 1, model, optimizer, scheduler)
    reloaded = Qwen2ForCausalLM.from_pretrained(path / "hf")
    assert_same_params(model, reloaded)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path / "hf")
    assert tokenizer("w1 w5 w59").input_ids == tiny_tokenizer()("w1 w5 w59").input_ids == [1, 5, 59]


def test_resume_gives_bit_identical_parameters(tmp_path: Path) -> None:
    # Uninterrupted reference: 4 steps.
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    reference, ref_opt, ref_sched = _trained(seed=0, steps=0)
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    for _ in range(4):
        train_step(reference, ref_opt, ref_sched)

    # Same run, checkpointed after step 2 and continued (saving must not disturb the RNG streams) ...
    run, run_opt, run_sched = _trained(seed=0, steps=0)
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    for _ in range(2):
        train_step(run, run_opt, run_sched)
    path = _save(tmp_path, 2, run, run_opt, run_sched)
    for _ in range(2):
        train_step(run, run_opt, run_sched)
    assert_same_params(reference, run)

    # ... and resumed into a fresh process-like state: other weights, fresh optimizer, moved RNGs.
    _rng_draws()
    assert_resumed_run_continues_as(path, reference, steps=2)


def test_keep_last_rotates_only_complete_older_checkpoints(tmp_path: Path) -> None:
    model, optimizer, scheduler = _trained()
    partial = tmp_path / "global_step_0"  # a folder without manifest: never counted, never rotated away
    partial.mkdir(parents=True)
    (partial / "optimizer.pt").write_bytes(b"junk")
    for step in (1, 2, 3):
        _save(tmp_path, step, model, optimizer, scheduler, keep_last=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["global_step_0", "global_step_2", "global_step_3", LATEST_FILE_NAME]
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_3"

    _save(tmp_path, 4, model, optimizer, scheduler, keep_last=1)
    assert not (tmp_path / "global_step_2").exists() and not (tmp_path / "global_step_3").exists()
    assert (tmp_path / LATEST_FILE_NAME).read_text().strip() == "4"


def test_find_latest_skips_partial_and_corrupt_folders(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, optimizer, scheduler = _trained()
    assert find_latest_checkpoint(tmp_path / "missing") is None
    first = _save(tmp_path, 1, model, optimizer, scheduler)
    second = _save(tmp_path, 2, model, optimizer, scheduler)
    with open(second / "optimizer.pt", "r+b") as f:  # a truncated file, as from a half copy
        f.truncate(10)
    temp = tmp_path / ".tmp-global_step_3-12345"
    (temp / "hf").mkdir(parents=True)

    with caplog.at_level(logging.WARNING, logger="dapo.infra.checkpoint"):
        assert find_latest_checkpoint(tmp_path) == first
    assert "global_step_2" in caplog.text and "optimizer.pt has 10 bytes" in caplog.text
    assert ".tmp-global_step_3-12345" in caplog.text
    assert is_complete_checkpoint(first) and not is_complete_checkpoint(second)

    with pytest.raises(CheckpointError, match=r"not a complete checkpoint \(optimizer.pt has 10 bytes"):
        load_checkpoint(second, model=model, optimizer=optimizer, scheduler=scheduler)

    # The next save clears the leftover temp folder and replaces the corrupt step-2 folder.
    again = _save(tmp_path, 2, model, optimizer, scheduler)
    assert not temp.exists() and is_complete_checkpoint(again)
    assert find_latest_checkpoint(tmp_path) == again


def test_bad_trainer_state_is_rejected_and_leaves_nothing_behind(tmp_path: Path) -> None:
    model, optimizer, scheduler = _trained()
    with pytest.raises(TypeError, match="trainer_state keys must be str"):
        _save(tmp_path, 1, model, optimizer, scheduler, {1: "x"})
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        _save(tmp_path, -1, model, optimizer, scheduler)

    class Opaque:
        pass

    with pytest.raises(CheckpointError, match=r"while writing trainer_state.pt for step 1; there is no previous"):
        _save(tmp_path, 1, model, optimizer, scheduler, {"step": 1, "obj": Opaque()})
    assert list(tmp_path.iterdir()) == []


def test_load_rejects_a_different_architecture(tmp_path: Path) -> None:
    model, optimizer, scheduler = _trained()
    path = _save(tmp_path, 1, model, optimizer, scheduler)
    bigger = tiny_qwen2(0, CHECKPOINT, num_hidden_layers=3)
    with pytest.raises(CheckpointError, match="weights missing from the checkpoint"):
        load_checkpoint(path, model=bigger, optimizer=None, scheduler=None)


def test_a_moe_model_saved_per_expert_loads_back_into_its_fused_experts(tmp_path: Path) -> None:
    """Transformers 5 holds a Qwen3-MoE layer's experts fused (``mlp.experts.gate_up_proj``) and ``save_pretrained``
    writes them one per expert (``mlp.experts.0.gate_proj.weight``), as the Hub's checkpoints are: the load converts
    back (it used to refuse every MoE checkpoint, "weights not in the model"), bit for bit, and a folder of another
    architecture is refused naming the first tensor that does not fit."""
    from safetensors.torch import load_file

    from tests.model.families import build_tiny_model

    saved = build_tiny_model("qwen3_moe", seed=1)
    optimizer = torch.optim.AdamW(saved.parameters(), lr=1e-3)
    path = save_checkpoint(
        tmp_path, 1, model=saved, tokenizer=None, optimizer=optimizer, scheduler=None, trainer_state={"step": 1}
    )
    on_disk = load_file(path / "hf" / "model.safetensors")
    assert any(".mlp.experts.0." in k for k in on_disk) and not any(k.endswith("experts.gate_up_proj") for k in on_disk)
    loaded = build_tiny_model("qwen3_moe", seed=2)
    assert not torch.equal(
        loaded.state_dict()["model.layers.0.mlp.experts.gate_up_proj"],
        saved.state_dict()["model.layers.0.mlp.experts.gate_up_proj"],
    )
    load_checkpoint(path, model=loaded, optimizer=torch.optim.AdamW(loaded.parameters(), lr=1e-3), scheduler=None)
    want, got = saved.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    with pytest.raises(CheckpointError, match="size mismatch for model.embed_tokens.weight.*different architecture"):
        load_checkpoint(path, model=tiny_qwen2(0, CHECKPOINT), optimizer=None, scheduler=None)
