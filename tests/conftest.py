"""Suite-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Every test runs on one intra-op thread: the shapes are tiny, and on a 2-core CI machine extra threads only
    contend. Subprocess tests set OMP_NUM_THREADS / trainer.num_threads themselves."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
