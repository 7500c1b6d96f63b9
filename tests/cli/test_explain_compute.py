"""`dapo explain`'s compute section: the step's model FLOPs for the default run, computed by hand."""

from __future__ import annotations

from click.testing import CliRunner

from dapo.cli.main import cli


def test_default_run_flops_by_hand() -> None:
    result = CliRunner().invoke(cli, ["explain", "--gpu", "a100", "--mfu", "0.5"])
    assert result.exit_code == 0, result.output
    out = result.output
    # tiny Qwen2: N = 4 x (128 x (128 + 2 x 64) + 128 x 128 + 3 x 128 x 512) + 601 x 128 = 1,059,968 matmul weights;
    # 4 L H d = 4 x 4 x 4 x 32 = 2048 per query-key pair. Mean prompt 128 (once), 8 responses of 32 tokens:
    # linear 2 N x (128 + 256) = 814,055,424; pairs 128 x 129 / 2 + 8 x (32 x 128 + 32 x 33 / 2) = 45,248
    # -> 814,055,424 + 2048 x 45,248 = 906,723,328 per group
    assert "58.03 GFLOP = 2 x 32 x 906.72 MFLOP (prompt 128 once + 8 x 32 response tokens)" in out
    assert "87.05 GFLOP = 1 x 32 x 3 x 906.72 MFLOP" in out
    # fp32 actor on one A100 (19.5 TFLOP/s): 87.05e9 / 19.5e12 = 4.46 ms; at 50% MFU 8.93 ms
    assert "actor update on 1 x A100 (fp32, 19.5 TFLOP/s each)" in out and "0.00446 s at 100% MFU, 0.00893 s" in out
    bad = CliRunner().invoke(cli, ["explain", "--gpu", "TPU"])
    assert bad.exit_code == 2 and "--gpu" in bad.output
