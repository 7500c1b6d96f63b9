import pytest

from tests.cli.cli_helpers import FAST


@pytest.fixture
def fast_args() -> list[str]:
    return list(FAST)
