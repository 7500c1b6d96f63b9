"""Fixtures for the checkpoint / tracking / progress / plot tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _few_threads() -> Iterator[None]:
    """The test machine is shared: keep torch to one intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
