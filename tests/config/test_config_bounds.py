"""Hostile config files: YAML alias bombs, self-references, huge, binary and non-UTF-8 files get short messages.

A 369-byte file with an 8-level alias chain in ``trainer.logger`` used to produce a 312 MB error message; every
message here is asserted to stay a few KB, and every refusal to name the file and the reason.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dapo.config import ConfigError, load_config, parse_override
from dapo.config.loading import MAX_CONFIG_BYTES, MAX_ECHO_CHARS, brief


def _alias_bomb(levels: int, width: int = 9) -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the previous one: width**(levels+1) strings."""
    lines = ["  a0: &a0 [" + ", ".join(['"x"'] * width) + "]"]
    lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "x:\n" + "\n".join(lines) + f"\ntrainer:\n  logger: *a{levels}\n"


def _refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


def test_an_alias_bomb_is_refused_before_validation_with_a_short_message(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(5))  # 9**6 = 531,441 strings from 300 bytes
    message = _refusal(path)
    assert len(message) < 1_000, len(message)  # was 3.5 MB (5 levels); 312 MB with 8
    assert str(path) in message and "aliases" in message


def test_a_value_under_the_expansion_bound_is_echoed_briefly(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(3))  # 6,561 strings: a legal size, an invalid trainer.logger
    message = _refusal(path)
    assert "trainer.logger" in message
    assert len(message) < 6_000, len(message)  # was 36 KB
    assert all(len(line) <= MAX_ECHO_CHARS + 200 for line in message.splitlines())


def test_a_self_referencing_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("trainer:\n  logger: &a [*a]\n")
    message = _refusal(path)
    assert "nested more than" in message and len(message) < 1_000


def test_an_alias_bomb_in_an_override_is_refused() -> None:
    text = "[&l0 [x, x, x, x, x, x, x, x, x, x]]"
    for level in range(1, 6):  # a list of anchors, each 10 aliases of the previous one: 10**6 values at the end
        text = text[:-1] + f", &l{level} [" + ", ".join([f"*l{level - 1}"] * 10) + "]]"
    with pytest.raises(ConfigError, match="aliases"):
        parse_override("trainer.logger=" + text)
    assert parse_override("trainer.logger=[&a [x], *a]") == ("trainer.logger", [["x"], ["x"]])  # a small one is fine


def test_a_config_file_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("trainer:\n  project_name: " + "x" * MAX_CONFIG_BYTES + "\n")
    message = _refusal(path)
    assert f"{path.stat().st_size:,} bytes" in message and len(message) < 1_000


def test_binary_and_non_utf8_config_files_get_a_message(tmp_path: Path) -> None:
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}" + bytes(range(256)))
    assert "a binary file" in _refusal(binary)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("trainer:\n  project_name: caf\xe9\n".encode("latin-1"))
    assert "not UTF-8 text (byte 28 is 0xe9)" in _refusal(latin1)


def test_the_cli_prints_the_message_not_a_traceback(tmp_path: Path) -> None:
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    done = subprocess.run(
        [sys.executable, "-m", "dapo.cli.main", "train", "--config", str(binary)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "UnicodeDecodeError" not in done.stderr
    assert "a binary file" in done.stderr


def test_brief_quotes_a_huge_value_without_expanding_it() -> None:
    huge = [["x"] * 1000] * 1000
    looped: list = []
    looped.append(looped)
    assert len(brief(huge)) <= MAX_ECHO_CHARS and len(brief("y" * 10**6)) <= MAX_ECHO_CHARS
    assert brief(looped) == "[[[[...]]]]"  # three levels, then "..."
    assert brief([1, "a"]) == "[1, 'a']"
