"""Sharded checkpoints (``actor.strategy=fsdp2``, ``trainer.checkpoint_format=auto``) and checkpoints moving between
world sizes and strategies, under real ranks of torch's elastic agent (gloo, CPU): every rank writes its own shards, a 2-rank run
resumes at 2 ranks bit-exactly, and the checkpoint continues through the other layouts in one chain of resumes (one
real launch each), each link loading what the one before it wrote:

- 2 fsdp2 ranks -> 2 fsdp2 ranks (step 3): sharded -> sharded at the same world size, DCP under a process group into
  FSDP2 shards, each rank restoring its own RNG file; this link is the bit-exact resume;
- 2 fsdp2 ranks -> one process (step 4): sharded -> whole tensors without a group (DCP's ``no_dist`` read);
- one process -> 2 replicated ranks (step 5): the full format (``hf/`` + ``optimizer.pt``) into every replica, and the
  replicated save (the replicas are checked to agree, rank 0 writes the full format);
- 2 replicated ranks -> 2 fsdp2 ranks (step 6): full -> sharded (every rank reads the full files and keeps its
  shards: ``load_full_model_state`` / ``load_full_optimizer_state``), then a sharded save again.

The moves left out take no code path these do not: sharded -> 2 replicated ranks is the same
``_load_sharded_state`` (DCP under a group, as in step 3, into whole tensors, as in step 4); full -> one process and
full -> replicated ranks are the same ``load_state_dict`` of the same files on each process, whichever layout wrote
them (one process and replicated rank 0 write the same full format); a sharded checkpoint read whole in a process
with no group at all is also checked here in-process, down to the optimizer moments.

One uninterrupted 3-step fsdp2 2-rank run (checkpoints at steps 2 and 3 kept) is the reference of every test: a copy
of its run directory without step 3 is a run interrupted after step 2, as a 2-step run would leave it (same weights,
optimizer, RNG and sampler state; only its metrics would also hold a last-step validation). Its own records show
rank 0 alone reporting and the weight-sync probe passing after every push from the shards.

The 2-rank launches are ``torchrun_warm``: torchrun's own elastic agent (its config from torchrun's own flag parsing)
forked warm, forking real rank processes that meet in a real gloo group; what is checked here is dapo's checkpoint
layouts, not torchrun's command line, which test_train_torchrun launches for real.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from dapo.infra.timing import is_measured_metric
from tests.distributed.test_train_torchrun import SMALL, metric_steps, step_lines
from tests.harness.runners import run_dapo_in_process, torchrun_warm

FSDP2 = [*SMALL, "trainer.total_training_steps=3", "actor.strategy=fsdp2"]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """An uninterrupted 3-step fsdp2 run on 2 ranks: its run directory and its launch."""
    root = tmp_path_factory.mktemp("reference")
    proc = torchrun_warm(FSDP2, root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / "tiny-synth", proc


@pytest.fixture(scope="module")
def reference(reference_run) -> Path:
    return reference_run[0]


def _interrupted_after_step_2(reference: Path, root: Path) -> Path:
    run_dir = root / "tiny-synth"
    shutil.copytree(reference, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "global_step_3")
    return run_dir


def _records(run_dir: Path) -> dict[int, dict]:
    return {
        r["step"]: {k: v for k, v in r.items() if not is_measured_metric(k)}
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    }


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "checkpoints" / f"global_step_{step}" / "hf" / "model.safetensors")


@pytest.mark.slow
def test_fsdp2_ranks_train_with_rank_0_reporting_and_every_push_reaching_the_engine(reference_run) -> None:
    run_dir, proc = reference_run
    assert step_lines(proc.stdout) == ["step 1/3", "step 2/3", "step 3/3"] and proc.stdout.count("done: 3 steps") == 1
    assert metric_steps(run_dir) == [1, 2, 3]  # rank 0 alone writes the record
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        # The engine generates from its own copy: the probe ran after each push and passed (an unsynced copy would
        # show the whole update), and pi_old was recomputed (the copy's log-probs are not the actor's own).
        assert 0.0 <= record["rollout/probe_logprob_diff"] <= 1e-4
        assert record["actor/num_optimizer_steps"] == 2.0 and record["actor/old_log_prob_recomputed"] == 1.0
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir()) == [
        "global_step_2",
        "global_step_3",
    ]


@pytest.mark.slow
def test_two_ranks_write_their_own_shards_and_resume_bit_exactly(reference: Path, fsdp2_resumed: Path) -> None:
    ckpt = reference / "checkpoints" / "global_step_2"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["layout"] == "sharded" and manifest["world_size"] == 2
    files = manifest["files"]
    assert "optimizer.pt" not in files  # nothing was gathered whole onto rank 0
    shards = {rank: files[f"sharded/__{rank}_0.distcp"]["size"] for rank in (0, 1)}
    # Each rank wrote about half of the model + AdamW state (FSDP2 shards every parameter's first dimension).
    assert max(shards.values()) < 0.6 * sum(shards.values())
    assert {
        "sharded/.metadata",
        "rng_rank0.pt",
        "rng_rank1.pt",
        "hf/model.safetensors",
        "hf/config.json",
    } <= files.keys()
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(ckpt / "hf") is not None  # the export vLLM / transformers read

    # The chain's first link: the run interrupted after step 2, resumed on 2 fsdp2 ranks (the reference's command).
    run_dir = fsdp2_resumed
    # Bit-identical continuation: the same step-3 weights, and the same step-3 record (rewards, losses, grad norms,
    # entropy, lengths, validation), as the run that was never interrupted.
    ours, theirs = _weights(run_dir, 3), _weights(reference, 3)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert _records(run_dir)[3] == _records(reference)[3]


@pytest.mark.slow
def test_the_two_rank_sharded_checkpoint_loads_whole_in_a_process_without_a_group(reference: Path) -> None:
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


def _resume(run_dir: Path, steps: int, how: str) -> dict:
    """Continue the run in ``run_dir`` to step ``steps`` in one launch: ``how`` is "one process" (the CLI run in this
    pytest process, where torch is already imported: a process without a process group, as a plain `dapo train` is),
    or a strategy on 2 ranks under torch's elastic agent. Checks the launch resumed the step before and ran this one step; returns its
    record."""
    args = [*SMALL, f"trainer.total_training_steps={steps}"]
    proc = (
        run_dapo_in_process(["train", *args], run_dir.parent)
        if how == "one process"
        else torchrun_warm([*args, f"actor.strategy={how}"], run_dir.parent)
    )
    assert proc.returncode == 0, (how, steps, proc.stderr[-4000:])
    # Rank 0 alone prints and records: one resume note, one status line and one metrics record per step.
    assert proc.stdout.count("resumed from") == 1 and f"(step {steps - 1})" in proc.stdout, (how, steps)
    assert step_lines(proc.stdout) == [f"step {steps}/{steps}"], (how, steps)
    assert proc.stdout.count(f"done: 1 steps (resumed at step {steps - 1}, now at step {steps})") == 1, (how, steps)
    assert metric_steps(run_dir) == list(range(1, steps + 1)), (how, steps)
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def _manifest(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "checkpoints" / f"global_step_{step}" / "manifest.json").read_text())


@pytest.fixture(scope="module")
def fsdp2_resumed(reference: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chain's first link: the reference interrupted after step 2, resumed to step 3 on 2 fsdp2 ranks with the
    reference's own command (sharded -> sharded, same world size). Its run directory, which the chain continues."""
    run_dir = _interrupted_after_step_2(reference, tmp_path_factory.mktemp("chain"))
    record = _resume(run_dir, 3, "fsdp2")
    assert record["actor/num_optimizer_steps"] == 2.0 and record["timing_s/gather"] > 0
    manifest = _manifest(run_dir, 3)
    assert manifest["layout"] == "sharded" and manifest["world_size"] == 2 and "optimizer.pt" not in manifest["files"]
    return run_dir


@pytest.mark.slow
def test_the_checkpoint_moves_between_world_sizes_and_strategies_in_every_direction(fsdp2_resumed: Path) -> None:
    # Without trainer.resume_with_changes: the strategy and the world size are a layout, not hyper-parameters
    # (resume.py lets them change). Each launch resumes the checkpoint the launch before it wrote, starting from the
    # fsdp2 ranks' step 3 (the first link, fsdp2 -> fsdp2, in the fixture).
    run_dir = fsdp2_resumed
    for step, how in [(4, "one process"), (5, "replicated"), (6, "fsdp2")]:
        record = _resume(run_dir, step, how)
        manifest = _manifest(run_dir, step)
        if how == "one process":
            assert "timing_s/gather" not in record
        else:
            # Both ranks took both optimizer steps (batch 4 in mini-batches of 2), the groups really were generated
            # in shares and gathered, and the step validated.
            assert record["actor/num_optimizer_steps"] == 2.0 and record["timing_s/gather"] > 0
            assert record["train/generated_tokens"] > 0 and "val/acc/mean@2" in record
        # fsdp2: each of the 2 ranks wrote its shards; replicated and one process: the full format (two replicas
        # agree, save_run checks it, and rank 0 writes one optimizer.pt).
        if how == "fsdp2":
            assert manifest["layout"] == "sharded" and manifest["world_size"] == 2
        assert ("optimizer.pt" in manifest["files"]) == (how != "fsdp2")
        assert (manifest.get("layout") == "sharded") == (how == "fsdp2")
        if step == 4:
            # Sharded (2 fsdp2 ranks, step 3) and full (one process, step 4) exports are the same format: the tied
            # LM head is left out of the sharded run's weights too.
            sharded, full = _weights(run_dir, 3), _weights(run_dir, 4)
            assert sharded.keys() == full.keys() and "lm_head.weight" not in sharded
    assert json.loads((run_dir / "checkpoints" / "global_step_6" / "trainer_state.json").read_text())["step"] == 6
