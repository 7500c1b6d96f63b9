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


# The files that start real processes (torchrun ranks, vLLM engines, `dapo train` runs, servers), slowest first, as
# measured (per-file sums of a local run, 2026-12-03). pytest-xdist hands whole files to its two workers as they free up, so
# starting with the longest files keeps one long file from running alone at the end (longest-processing-time-first);
# xdist's own reorder by test count (off in pyproject.toml) put these few-test files last, and the suite's last
# minutes ran on one worker. A file missing here only runs later; nothing is skipped.
SLOWEST_FILES_FIRST = (
    "tests/test_readme_commands.py",  # one test, 135-171 s in the last CI runs: it ran 147th of 166 files, near the end
    "tests/faults/test_async_faults.py",  # four `dapo train` runs killed or stopped on purpose, ~3 min here
    "tests/distributed/test_vllm_torchrun.py",
    "tests/training/test_async_training.py",
    "tests/cli/test_train_vllm_cli.py",
    "tests/distributed/test_kill_resume_torchrun.py",
    "tests/distributed/test_sharded_checkpoint.py",
    "tests/faults/test_soak.py",
    "tests/serve/test_serve_process.py",
    "tests/distillation/test_bench_script.py",  # ~2.5 min here (7 dapo processes), not yet in a measured run
    "tests/cli/test_train_tools_cli.py",
    "tests/faults/test_faults_cli.py",
    "tests/distributed/test_train_torchrun.py",
    "tests/rollout/test_worker.py",
    "tests/distributed/test_rank_invariance.py",
    "tests/faults/test_fuzz.py",
    "tests/rollout/test_multi_turn.py",
    "tests/distributed/test_async_torchrun.py",
    "tests/cli/test_resume.py",
    "tests/distributed/test_data_parallel.py",
    "tests/cli/test_train_cli.py",
    "tests/tools/test_sandbox_hostile.py",
    "tests/cli/test_objective_modes.py",
    "tests/model/test_family_matrix.py",  # added 2026-12-07 from single-file runs here, not yet a measured CI order
    "tests/distributed/test_lora_fsdp_torchrun.py",
    "tests/model/test_router_replay_training.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOWEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest keep order
