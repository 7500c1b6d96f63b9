"""Fixtures of the data-layer tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import SHARED_DATA


@pytest.fixture
def shared_data() -> Path:
    """The real data sets in ../shared/data; skips when that folder is absent (a fresh clone)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data sets not available: {SHARED_DATA.resolve()} does not exist")
    return SHARED_DATA.resolve()
