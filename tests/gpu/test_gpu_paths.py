"""The paths that only a GPU runs: vLLM's sleep mode and its bf16 weights pushed from an fp32 actor, one real training
step with vLLM on CUDA, and 2 NCCL ranks with an FSDP2 actor in bf16 feeding a vLLM engine.

Every test skips here (no CUDA device) with the reason; on a machine with a GPU they run with the rest of the suite,
and ``scripts/gpu_check.sh`` runs them alone with the throughput figures the issues ask for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dapo
from tests.cli.cli_helpers import FAST
from tests.harness.runners import run_dapo

ASSET = Path(dapo.__file__).parent / "assets" / "tiny-qwen2"
NO_GPU = "no CUDA device: the GPU paths (vLLM sleep mode, NCCL, bf16 FSDP2) run only on a GPU machine"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL ranks)")


def needs_vllm() -> None:
    from dapo.rollout.vllm_engine import vllm_available

    ok, reason = vllm_available()
    if not ok:
        pytest.skip(reason)


def free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


@needs_gpu
def test_vllm_sleeps_between_generations_and_wakes_with_the_pushed_weights() -> None:
    needs_vllm()
    from transformers import AutoModelForCausalLM

    from dapo.rollout.base import SamplingParams
    from dapo.rollout.spec import EngineSpec, VLLMOptions
    from dapo.rollout.vllm_engine import VLLMRolloutEngine
    from dapo.training.weight_sync import actor_log_probs_of

    actor = AutoModelForCausalLM.from_pretrained(ASSET, dtype=torch.float32).cuda().eval()
    spec = EngineSpec(
        name="vllm",
        dtype="bfloat16",
        max_model_len=128,
        vllm=VLLMOptions(free_cache_engine=True, gpu_memory_utilization=0.3),
    )
    engine = VLLMRolloutEngine(ASSET, spec, eos_token_ids=2)
    try:
        assert engine.free_cache_engine, "CUDA has vLLM's sleep mode"
        awake = free_bytes()
        out = engine.generate([[1, 2, 3, 4]], SamplingParams(n=4, max_tokens=16, seed=0))
        assert len(out) == 4
        asleep = free_bytes()
        assert asleep > awake, "sleeping released the weights and the KV cache"
        with torch.no_grad():
            for p in actor.parameters():
                p.add_(0.01 * torch.randn_like(p))
        engine.update_weights(actor.named_parameters())  # wakes the weights alone, loads the new ones
        prompt, response = [1, 369, 201, 371, 267], [19, 22, 383, 223]
        gap = (torch.tensor(engine.log_probs_of(prompt, response)) - actor_log_probs_of(actor, prompt, response)).abs()
        assert float(gap.mean()) < 0.05, "bf16 vLLM against the fp32 actor after the push: numerics only"
    finally:
        engine.close()


@needs_gpu
def test_one_training_step_with_vllm_on_cuda(tmp_path: Path) -> None:
    needs_vllm()
    proc = run_dapo(
        [
            "train",
            *FAST,
            "trainer.total_training_steps=1",
            "trainer.device=cuda",
            "rollout.name=vllm",
            "rollout.free_cache_engine=true",
            "rollout.gpu_memory_utilization=0.3",
            f"trainer.default_local_dir={tmp_path}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((tmp_path / "tiny-synth" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["rollout/probe_logprob_diff"] < 0.05
    assert record["rollout/num_tokens"] > 0


@needs_two_gpus
def test_two_nccl_ranks_with_a_bf16_fsdp2_actor_and_vllm(tmp_path: Path) -> None:
    needs_vllm()
    from tests.harness.ports import free_port

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "dapo.cli.main",
        "train",
        *FAST,
        "trainer.total_training_steps=2",
        "rollout.name=vllm",
        "rollout.free_cache_engine=true",
        "rollout.gpu_memory_utilization=0.3",
        "actor.strategy=fsdp2",
        "actor.fsdp.param_dtype=bfloat16",
        f"trainer.default_local_dir={tmp_path}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "tiny-synth" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollout/probe_logprob_diff"] < 0.05 for r in records)
