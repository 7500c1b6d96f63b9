"""Fixtures for dapo.rollout tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from transformers import Qwen2ForCausalLM

from tests.harness.models import tiny_qwen2

from .rollout_helpers import ForwardRowCounter


@pytest.fixture
def tiny_model() -> Qwen2ForCausalLM:
    return tiny_qwen2(0)


@pytest.fixture
def row_counter() -> Iterator[Callable[[torch.nn.Module], ForwardRowCounter]]:
    counters: list[ForwardRowCounter] = []

    def attach(model: torch.nn.Module) -> ForwardRowCounter:
        counter = ForwardRowCounter(model)
        counters.append(counter)
        return counter

    yield attach
    for counter in counters:
        counter.remove()
