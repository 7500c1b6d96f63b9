"""The OpenMP waiting policy each command runs under: passive by default, libgomp's own for `dapo train` with the
in-process engine, and whatever the user exported, always. Checked in fresh interpreters, as the CLI starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os, sys
import dapo.cli.main
from dapo.cli.openmp import spin_when_alone
assert "torch" not in sys.modules, "torch loaded before the policy was chosen"
spin_when_alone({alone})
print(os.environ.get("OMP_WAIT_POLICY", "<libgomp default>"))
"""


def policy(alone: bool, exported: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if exported is not None:
        env["OMP_WAIT_POLICY"] = exported
    out = subprocess.run([sys.executable, "-c", PROBE.format(alone=alone)], env=env, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


@pytest.mark.parametrize(("alone", "exported", "want"), [
    (False, None, "PASSIVE"),  # eval / serve / vLLM training: another process computes alongside
    (True, None, "<libgomp default>"),  # dapo train with the Transformers engine
    (True, "PASSIVE", "PASSIVE"),  # the user's choice stands
    (False, "ACTIVE", "ACTIVE"),
])
def test_wait_policy_by_command_and_user_choice(alone: bool, exported: str | None, want: str) -> None:
    assert policy(alone, exported) == want
