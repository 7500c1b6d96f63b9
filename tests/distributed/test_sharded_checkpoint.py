"""Sharded checkpoints (``actor.strategy=fsdp2``, ``trainer.checkpoint_format=auto``) under real torchrun ranks (gloo,
CPU): every rank writes its own shards, a 2-rank run resumes at 2 ranks bit-exactly, and the same checkpoint continues
in one process and in the replicated strategy (DCP reshards on load), and a one-process full checkpoint continues on
2 fsdp2 ranks.

One uninterrupted 3-step 2-rank run (checkpoints at steps 2 and 3 kept) is the reference of the first two tests: a
copy of its run directory without step 3 is a run interrupted after step 2, as a 2-step run would leave it (same weights,
optimizer, RNG and sampler state; only its metrics would also hold a last-step validation).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.cli.cli_helpers import run_dapo
from tests.distributed.test_train_torchrun import SMALL, metric_steps, step_lines, torchrun

FSDP2 = [*SMALL, "trainer.total_training_steps=3", "actor.strategy=fsdp2"]
# Keys of a step's record that depend on the machine, not on the run's state.
_NOT_STATE = ("timing_s/", "perf/", "memory/")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of an uninterrupted 3-step fsdp2 run on 2 ranks."""
    root = tmp_path_factory.mktemp("reference")
    proc = torchrun(FSDP2, root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / "tiny-synth"


def _interrupted_after_step_2(reference: Path, root: Path) -> Path:
    run_dir = root / "tiny-synth"
    shutil.copytree(reference, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "global_step_3")
    return run_dir


def _records(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(_NOT_STATE)}
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(run_dir / "checkpoints" / f"global_step_{step}" / "hf" / "model.safetensors")


@pytest.mark.slow
def test_two_ranks_write_their_own_shards_and_resume_bit_exactly(reference: Path, tmp_path: Path) -> None:
    ckpt = reference / "checkpoints" / "global_step_2"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["layout"] == "sharded" and manifest["world_size"] == 2
    files = manifest["files"]
    assert "optimizer.pt" not in files  # nothing was gathered whole onto rank 0
    shards = {rank: files[f"sharded/__{rank}_0.distcp"]["size"] for rank in (0, 1)}
    # Each rank wrote about half of the model + AdamW state (FSDP2 shards every parameter's first dimension).
    assert max(shards.values()) < 0.6 * sum(shards.values())
    assert {"sharded/.metadata", "rng_rank0.pt", "rng_rank1.pt", "hf/model.safetensors",
            "hf/config.json"} <= files.keys()
    from transformers import AutoModelForCausalLM
    assert AutoModelForCausalLM.from_pretrained(ckpt / "hf") is not None  # the export vLLM / transformers read

    run_dir = _interrupted_after_step_2(reference, tmp_path)
    resumed = torchrun(FSDP2, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stdout and "(step 2)" in resumed.stdout
    assert step_lines(resumed.stdout) == ["step 3/3"]
    assert metric_steps(run_dir) == [1, 2, 3]
    # Bit-identical continuation: the same step-3 weights, and the same step-3 record (rewards, losses, grad norms,
    # entropy, lengths, validation), as the run that was never interrupted.
    ours, theirs = _weights(run_dir, 3), _weights(reference, 3)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert _records(run_dir)[3] == _records(reference)[3]


@pytest.mark.slow
def test_the_two_rank_sharded_checkpoint_resumes_in_one_process_and_replicated(reference: Path,
                                                                                tmp_path: Path) -> None:
    # In this process, without a process group: DCP's no_dist path assembles the shards of both ranks into a plain
    # model and AdamW, whose weights are then exactly the gathered hf/ export of the same step.
    from transformers import AutoModelForCausalLM

    from dapo.actor.optim import build_optimizer
    from dapo.config import DapoConfig
    from dapo.infra.checkpoint import load_checkpoint

    ckpt = reference / "checkpoints" / "global_step_2"
    model = AutoModelForCausalLM.from_pretrained(ckpt / "hf")
    exported = {k: v.clone() for k, v in model.state_dict().items()}
    torch.nn.init.normal_(model.model.embed_tokens.weight)  # other weights, so the load must really write them
    optimizer = build_optimizer(model, DapoConfig().actor.optim)
    assert load_checkpoint(ckpt, model=model, optimizer=optimizer, scheduler=None)["step"] == 2
    assert all(torch.equal(v, exported[k]) for k, v in model.state_dict().items())
    assert len(optimizer.state) == len(list(model.parameters()))
    for param in model.parameters():
        slot = optimizer.state[param]
        assert slot["exp_avg"].shape == param.shape and slot["exp_avg"].abs().sum() > 0  # whole, trained moments
        assert float(slot["step"]) == 4.0  # 2 steps x 2 mini-batches

    one = _interrupted_after_step_2(reference, tmp_path / "one")
    proc = run_dapo(["train", *SMALL, "trainer.total_training_steps=3"], tmp_path / "one")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(step 2)" in proc.stdout and step_lines(proc.stdout) == ["step 3/3"]
    assert metric_steps(one) == [1, 2, 3]
    assert (one / "checkpoints" / "global_step_3" / "optimizer.pt").is_file()  # one process writes the full format

    two = _interrupted_after_step_2(reference, tmp_path / "two")
    proc = torchrun([*SMALL, "trainer.total_training_steps=3", "actor.strategy=replicated"], tmp_path / "two")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "(step 2)" in proc.stdout and step_lines(proc.stdout) == ["step 3/3"]
    assert metric_steps(two) == [1, 2, 3]
    # Two replicas agree (save_run checks it) and sum the same gradients as one process over the same groups.
    assert _weights(two, 3).keys() == _weights(one, 3).keys()


@pytest.mark.slow
def test_a_one_process_full_checkpoint_continues_on_two_fsdp2_ranks_which_then_write_shards(tmp_path: Path) -> None:
    run_dir = tmp_path / "tiny-synth"
    one = run_dapo(["train", *SMALL, "trainer.total_training_steps=1"], tmp_path)
    assert one.returncode == 0, one.stderr[-4000:]
    assert (run_dir / "checkpoints" / "global_step_1" / "optimizer.pt").is_file()  # one process: the full format

    two = torchrun([*SMALL, "trainer.total_training_steps=2", "actor.strategy=fsdp2"], tmp_path)
    assert two.returncode == 0, two.stderr[-4000:]
    assert "(step 1)" in two.stdout and step_lines(two.stdout) == ["step 2/2"]
    manifest = json.loads((run_dir / "checkpoints" / "global_step_2" / "manifest.json").read_text())
    assert manifest["layout"] == "sharded" and manifest["world_size"] == 2
