"""SamplingParams validation, RolloutOutput invariants, and the engine protocol."""

from __future__ import annotations

import pytest
import torch

from dapo.rollout import HFRolloutEngine, RolloutEngine, RolloutOutput, SamplingParams
from tests.harness.models import tiny_qwen2

from .rollout_helpers import EOS, PAD


def test_defaults_are_valid_and_frozen() -> None:
    params = SamplingParams()
    assert (params.n, params.temperature, params.top_p, params.top_k, params.max_tokens) == (1, 1.0, 1.0, -1, 256)
    assert params.stop_token_ids == () and params.seed is None and not params.greedy
    with pytest.raises(AttributeError):
        params.n = 2  # type: ignore[misc]


def test_stop_token_ids_list_is_normalised_to_tuple() -> None:
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)  # type: ignore[arg-type]


def test_prompt_seeds_list_is_normalised_to_tuple() -> None:
    assert SamplingParams(prompt_seeds=[3, 4]).prompt_seeds == (3, 4)  # type: ignore[arg-type]
    assert SamplingParams().prompt_seeds is None


def test_temperature_zero_is_greedy() -> None:
    assert SamplingParams(temperature=0).greedy


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"n": 0}, "n"),
        ({"n": 1.5}, "n"),
        ({"n": True}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop_token_ids": (1, -1)}, r"stop_token_ids\[1\]"),
        ({"stop_token_ids": "ab"}, "stop_token_ids"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.0}, "seed"),
        ({"prompt_seeds": (1, -1)}, r"prompt_seeds\[1\]"),
        ({"prompt_seeds": (1 << 63,)}, r"prompt_seeds\[0\]"),
        ({"prompt_seeds": "ab"}, "prompt_seeds"),
    ],
)
def test_out_of_range_values_are_rejected_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_top_k_off_values_are_accepted() -> None:
    SamplingParams(top_k=-1)
    SamplingParams(top_k=0)
    SamplingParams(top_k=1)


def test_rollout_output_len_and_consistency_checks() -> None:
    output = RolloutOutput([0, 0], [[1, 2], [3]], [[-0.1, -0.2], [-0.3]], ["stop", "length"])
    assert len(output) == 2
    with pytest.raises(ValueError, match="logprobs has 1 entries"):
        RolloutOutput([0, 0], [[1], [2]], [[-0.1]], ["stop", "stop"])
    with pytest.raises(ValueError, match="sample 1: 1 response ids but 2 logprobs"):
        RolloutOutput([0, 0], [[1], [2]], [[-0.1], [-0.1, -0.2]], ["stop", "stop"])
    with pytest.raises(ValueError, match="finish_reason must be one of"):
        RolloutOutput([0], [[1]], [[-0.1]], ["eos"])


def test_hf_engine_satisfies_the_protocol() -> None:
    engine = HFRolloutEngine(tiny_qwen2(0), eos_token_ids=EOS, pad_token_id=PAD)
    assert isinstance(engine, RolloutEngine)
    assert not isinstance(torch.nn.Linear(2, 2), RolloutEngine)
