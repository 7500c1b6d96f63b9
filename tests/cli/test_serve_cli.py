"""`dapo serve` options (the running server is tested in tests/serve/test_ray_serve.py)."""

from __future__ import annotations

from click.testing import CliRunner

from dapo.cli.main import cli


def test_serve_help_lists_the_published_options():
    r = CliRunner().invoke(cli, ["serve", "--help"])
    assert r.exit_code == 0
    for option in ("--host", "--port", "--backend", "--tensor-parallel-size", "--num-replicas"):
        assert option in r.output
    assert "127.0.0.1" in r.output


def test_serve_rejects_a_bad_backend():
    r = CliRunner().invoke(cli, ["serve", "--backend", "tpu"])
    assert r.exit_code == 2 and "tpu" in r.output
