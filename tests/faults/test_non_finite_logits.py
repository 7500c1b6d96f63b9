"""Non-finite logits stop generation with a message naming the phase and what to do, never an index error.

Unit level on the sampler (every way a row can have no distribution), then through the CLI with a model whose
weights hold a NaN: the run stops at its first generation, cleanly. The CLI runs in this process (torch is loaded
already; tests/faults/test_faults_cli.py keeps real ``dapo`` processes that fail mid-run).
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dapo.model.loading import EMBEDDED_MODEL_DIR
from dapo.rollout.sampler import NonFiniteLogitsError, sample_next_tokens
from tests.cli.cli_helpers import FAST
from tests.harness.runners import run_dapo_in_process

FINITE = [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "bad_row",
    [
        [0.0, math.nan, 1.0, 2.0],  # one NaN
        [0.0, math.inf, 1.0, 2.0],  # +inf: softmax is inf/inf = NaN
        [-math.inf] * 4,  # nothing left to draw from
    ],
    ids=["nan", "posinf", "all_neg_inf"],
)
@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": 1.0}, {"temperature": 0.0}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.0, "top_k": 2}],
    ids=["plain", "greedy", "top_p", "top_k"],
)
def test_every_non_finite_row_is_a_clear_error(bad_row, kwargs) -> None:
    logits = torch.tensor([FINITE, bad_row, FINITE])
    with pytest.raises(NonFiniteLogitsError) as info:
        sample_next_tokens(logits, **kwargs)
    message = str(info.value)
    assert message.startswith("phase generation: the policy produced non-finite next-token logits")
    assert "1 of 3 sequences (first: [1])" in message and "actor.optim.lr" in message


def test_finite_logits_with_masked_tokens_and_overflowing_temperature() -> None:
    masked = torch.tensor([[0.0, -math.inf, 1.0, -math.inf]])  # -inf for a few tokens is a valid distribution
    tokens, logprobs = sample_next_tokens(masked, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert tokens.item() in (0, 2) and torch.isfinite(logprobs).all()
    big = torch.tensor([[3e38, 0.0, 1.0, 2.0]])  # finite, but / 0.1 overflows float32 to +inf
    sample_next_tokens(big, temperature=1.0)
    with pytest.raises(NonFiniteLogitsError, match="rollout.temperature"):
        sample_next_tokens(big, temperature=0.1)


@pytest.mark.slow
def test_nan_weights_stop_the_run_in_generation_without_a_traceback(tmp_path) -> None:
    model_dir = tmp_path / "nan-model"
    shutil.copytree(EMBEDDED_MODEL_DIR, model_dir)
    weights = load_file(model_dir / "model.safetensors")
    name = next(k for k in weights if k.endswith("norm.weight"))  # the final norm: every logit becomes NaN
    weights[name] = torch.full_like(weights[name], math.nan)
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    # The weight-sync probe would stop first (on a NaN log-prob gap); without it generation meets the NaN logits.
    proc = run_dapo_in_process(
        [
            "train",
            *FAST,
            f"model.path={model_dir}",
            "trainer.val_before_train=false",
            "rollout.weight_sync_probe=false",
        ],
        tmp_path,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "phase generation: the policy produced non-finite next-token logits" in proc.stderr
    assert "out of bounds" not in proc.stderr
