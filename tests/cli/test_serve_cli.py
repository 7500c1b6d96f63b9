"""`dapo serve` options (the running server is tested in tests/serve/test_serve_process.py)."""

from __future__ import annotations

from click.testing import CliRunner

from dapo.cli.main import cli
from tests.harness.ports import held_port


def test_serve_help_lists_the_published_options():
    r = CliRunner().invoke(cli, ["serve", "--help"])
    assert r.exit_code == 0
    for option in ("--host", "--port", "--backend", "--tensor-parallel-size", "--num-replicas"):
        assert option in r.output
    assert "127.0.0.1" in r.output
    for option in ("--header-timeout", "--body-timeout", "--max-unfinished-uploads", "--keep-alive-timeout"):
        assert option in r.output  # the front door's bounds


def test_serve_rejects_a_bad_backend():
    r = CliRunner().invoke(cli, ["serve", "--backend", "tpu"])
    assert r.exit_code == 2 and "tpu" in r.output


def test_a_port_in_use_is_one_message_before_ray_starts():
    with held_port() as port:
        r = CliRunner().invoke(cli, ["serve", "--port", str(port)])
    assert r.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in r.output and "--port" in r.output
    assert "Traceback" not in r.output


def test_a_missing_model_is_one_message(tmp_path):
    r = CliRunner().invoke(cli, ["serve", str(tmp_path / "no-such-model")])
    assert r.exit_code == 1 and "no-such-model" in r.output and "does not exist" in r.output
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(cli, ["serve", str(tmp_path / "empty")])
    assert r.exit_code == 1 and "config.json" in r.output


def test_ray_failures_are_explained_with_the_fix():
    import pytest

    exceptions = pytest.importorskip("ray.exceptions")
    from dapo.serve.ray_runtime import explain_ray_failure

    auth = explain_ray_failure(exceptions.AuthenticationError("InvalidAuthToken: token mismatch"), "10.0.0.5:6379")
    assert "10.0.0.5:6379" in auth and "RAY_AUTH_TOKEN" in auth and "RAY_AUTH_MODE" in auth
    slow = explain_ray_failure(
        Exception("The current node timed out during startup. This could happen because some of the raylet failed"),
        None,
    )
    assert "30 s" in slow and "--ray-address" in slow and "\n" not in slow


def test_a_checkpoint_whose_weights_changed_is_one_message_before_ray_starts(tmp_path):
    # Before: the damaged weights passed the check and the server would have started serving them (here the port
    # held below stops it at the next check, "cannot listen", instead).
    from tests.cli.cli_helpers import flip_middle_byte, save_embedded_checkpoint

    ckpt = save_embedded_checkpoint(tmp_path / "checkpoints")
    flip_middle_byte(ckpt / "hf" / "model.safetensors")
    with held_port() as port:
        r = CliRunner().invoke(cli, ["serve", str(ckpt / "hf"), "--port", str(port)])
    assert r.exit_code == 1 and "cannot serve the model" in r.output, r.output
    assert "hf/model.safetensors does not match its checksum" in r.output and "another checkpoint" in r.output
    assert "cannot listen" not in r.output and "Traceback" not in r.output
