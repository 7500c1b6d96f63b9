"""The OpenMP waiting policy every command runs under: passive, unless the user exported a policy or a spin count.
Checked in fresh interpreters, as the CLI starts, and in a real `dapo train` process (the environment its libgomp
read is the one the process was started with plus what dapo.cli.main set before torch loaded)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os, sys
import dapo.cli.main
assert "torch" not in sys.modules, "torch loaded before the policy was chosen"
print(os.environ.get("OMP_WAIT_POLICY", "<libgomp default>"), os.environ.get("GOMP_SPINCOUNT", "-"))
"""


def policy(exported: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(exported)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize(
    ("exported", "want"),
    [
        ({}, "PASSIVE -"),  # every command, dapo train with the in-process engine included (#39 item 12)
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE -"),  # the user's choice stands
        ({"OMP_WAIT_POLICY": "PASSIVE"}, "PASSIVE -"),
        ({"GOMP_SPINCOUNT": "300000"}, "<libgomp default> 300000"),  # a spin count is a choice too: no PASSIVE over it
    ],
)
def test_wait_policy_is_passive_unless_the_user_chose(exported: dict[str, str], want: str) -> None:
    assert policy(exported) == want


def test_dapo_train_with_the_in_process_engine_waits_passively(tmp_path) -> None:
    """The run that spun before (the sync loop with the Transformers engine, alone in its process): it collapsed ~2x
        beside any other computing process. A missing data file stops the run after its policy is final (and before it
    loads a model)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = (
        "import os, sys; sys.argv = ['dapo', 'train', 'data.train_files=[missing.parquet]']\n"
        "import dapo.cli.main as m\n"
        "try:\n    m.main()\nexcept SystemExit:\n    pass\n"
        "print('POLICY', os.environ.get('OMP_WAIT_POLICY'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert "missing.parquet" in out.stdout + out.stderr  # it got past the config, into the command
    assert "POLICY PASSIVE" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
