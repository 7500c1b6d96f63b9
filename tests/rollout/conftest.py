"""Fixtures for dapo.rollout tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from transformers import Qwen2ForCausalLM

from .rollout_helpers import ForwardRowCounter, build_tiny_qwen2


@pytest.fixture
def tiny_model() -> Qwen2ForCausalLM:
    return build_tiny_qwen2(0)


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


@pytest.fixture(autouse=True)
def single_thread() -> Iterator[None]:
    """Run each test on one intra-op thread: the shapes are tiny, and on a shared CPU extra threads only contend."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
