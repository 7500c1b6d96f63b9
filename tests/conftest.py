"""Suite-wide fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import settings

# No per-example deadline: on a loaded 2-core machine a torch call can take longer than hypothesis's 200 ms default,
# which would fail a correct test. In CI the examples are derandomized so that a run is reproducible; locally they
# stay random so that new edge cases keep being found (as the k3 rounding case was).
settings.register_profile("dapo", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "dapo")


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Every test runs on one intra-op thread: the shapes are tiny, and on a 2-core CI machine extra threads only
    contend. Subprocess tests set OMP_NUM_THREADS / trainer.num_threads themselves."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
