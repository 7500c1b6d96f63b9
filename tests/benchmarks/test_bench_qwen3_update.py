"""benchmarks/bench_qwen3_update.py (scripts/gpu_check.sh's Qwen3-0.6B actor update) runs end to end: on CPU, with
--tiny and a few tokens, in a real process, it prints every field the GPU run reports; its model config is
Qwen3-0.6B's published one. No figure is asserted (this is not a measurement)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_qwen3_update.py"


CONFIG_DIR = ROOT / "configs" / "models" / "qwen3-0.6b"


def test_the_shipped_config_is_qwen3_0_6b() -> None:
    config = json.loads((CONFIG_DIR / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    expected = dict(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1000000,
        max_position_embeddings=40960,
    )
    assert {k: config[k] for k in expected} == expected
    assert not list(CONFIG_DIR.glob("*.safetensors"))  # no weights shipped


def test_the_update_and_generation_run_on_cpu_and_print_their_fields() -> None:
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--tiny",
        "--device=cpu",
        "--dtype=fp32",
        "--tokens=64",
        "--seq-len=32",
        "--prompt-len=8",
        "--steps=1",
        "--warmup=0",
        "--gen-prompts=2",
        "--gen-tokens=4",
        "--peak-tflops=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    update = next(line for line in out.splitlines() if line.startswith("actor update:"))
    for field in ("64 tokens/step", " s/step", " tokens/s", "MFU ", "given: --peak-tflops", "peak memory"):
        assert field in update, (field, update)
    assert "prime-rl one-H100 baseline (same model, 16K tokens/step): 1.99 s/step, 11,896 tokens/s, MFU 11.1 %" in out
    generation = next(line for line in out.splitlines() if line.startswith("HF engine generation:"))
    assert "8 tokens in" in generation and "tokens/s" in generation  # 2 prompts x 4 tokens, no stop token
