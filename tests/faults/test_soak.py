"""A short soak in CI: 3 SIGKILLs of a real run (one during a checkpoint write, two at random moments), each resumed,
end bit-identical (weights, optimizer state, metrics) to an uninterrupted run. The uninterrupted run is a fresh
`python -m dapo.cli.main`; the killed and resumed ones are real processes forked from a warm server (--warm:
tests/harness/runners.py), which spares the ~8 s of imports of each of their 4 starts. A longer soak runs by hand with the
same script (scripts/soak_kill.py --kills 10 --steps 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak_kill.py"

pytestmark = pytest.mark.slow


def test_random_kills_then_resume_end_bit_identical(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--kills",
            "3",
            "--save-kills",
            "1",
            "--steps",
            "3",
            "--seed",
            "1",
            "--warm",
            "--out",
            str(tmp_path / "soak"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["kills"] == 3 and result["kills_mid_checkpoint_write"] >= 1 and result["all_bit_identical"] is True, (
        result
    )
    assert result["series"] >= 1
