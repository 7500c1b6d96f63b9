"""All-or-nothing writes (dapo.infra.atomic): a file or folder is replaced whole; a writer that raises leaves the old
one untouched and no temporary behind (checked by listing the folder); an existing target folder is replaced, never
merged; and the temporary names are the ones ``is_temp_name`` recognises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

from dapo.infra.atomic import (
    atomic_directory,
    atomic_write,
    atomic_write_via_path,
    is_temp_name,
    replace_directory,
)


class WriterFailed(RuntimeError):
    pass


def _listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- atomic_write -------------------------------------------------------------------------------------------------


def test_atomic_write_bytes_creates_the_file_and_returns_its_path(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    assert atomic_write(target, b"\x00\x01payload") == target
    assert target.read_bytes() == b"\x00\x01payload"
    assert _listing(tmp_path) == ["out.bin"]


def test_atomic_write_str_is_utf8(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    atomic_write(str(target), "héllo ∑\n")  # a str path works too
    assert target.read_bytes() == "héllo ∑\n".encode("utf-8")


def test_atomic_write_callable_gets_a_binary_file_object(tmp_path: Path) -> None:
    seen: list[str] = []

    def write(f: IO[bytes]) -> None:
        seen.append(f.mode)
        f.write(b"part1,")
        f.write(b"part2")

    atomic_write(tmp_path / "out.csv", write)
    assert (tmp_path / "out.csv").read_bytes() == b"part1,part2"
    assert seen and "b" in seen[0]


def test_atomic_write_replaces_the_whole_content(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("a much longer old content that must not survive as a tail\n")
    atomic_write(target, "new")
    assert target.read_text() == "new"
    assert _listing(tmp_path) == ["out.txt"]


def test_atomic_write_creates_missing_parent_folders(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.txt"
    atomic_write(target, "x")
    assert target.read_text() == "x"


def test_atomic_write_failing_writer_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    (tmp_path / "neighbour.txt").write_text("n")

    def write(f: IO[bytes]) -> None:
        f.write(b"half of the new content")
        raise WriterFailed("disk on fire")

    with pytest.raises(WriterFailed, match="disk on fire"):
        atomic_write(target, write)
    assert target.read_text() == "old"
    assert _listing(tmp_path) == ["neighbour.txt", "out.txt"]


def test_atomic_write_failing_writer_with_no_old_file_creates_nothing(tmp_path: Path) -> None:
    def write(f: IO[bytes]) -> None:
        f.write(b"partial")
        raise WriterFailed

    with pytest.raises(WriterFailed):
        atomic_write(tmp_path / "out.txt", write)
    assert _listing(tmp_path) == []


def test_atomic_write_keyboard_interrupt_also_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")

    def write(f: IO[bytes]) -> None:
        f.write(b"partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, write)
    assert target.read_text() == "old"
    assert _listing(tmp_path) == ["out.txt"]


# ---- atomic_write_via_path ----------------------------------------------------------------------------------------


def test_via_path_hands_a_temp_sibling_with_the_target_suffix(tmp_path: Path) -> None:
    target = tmp_path / "table.parquet"
    seen: list[Path] = []

    def write_to(temp: Path) -> None:
        seen.append(temp)
        assert not temp.exists()  # the writer creates it
        temp.write_bytes(b"PAR1")

    assert atomic_write_via_path(target, write_to) == target
    (temp,) = seen
    assert temp.parent == tmp_path and temp.suffix == ".parquet" and temp != target
    assert temp.name.startswith(".")
    assert target.read_bytes() == b"PAR1"
    assert _listing(tmp_path) == ["table.parquet"]


@pytest.mark.parametrize("name", ["out.txt", "LATEST"])
def test_via_path_temp_names_are_recognised_and_fresh_per_call(tmp_path: Path, name: str) -> None:
    names: list[str] = []
    for _ in range(2):
        atomic_write_via_path(tmp_path / name, lambda temp: (names.append(temp.name), temp.write_text("x")))
    assert all(is_temp_name(n) for n in names), names
    assert names[0] != names[1], names


def test_via_path_without_a_suffix_uses_tmp(tmp_path: Path) -> None:
    seen: list[Path] = []

    def write_to(temp: Path) -> None:
        seen.append(temp)
        temp.write_text("x")

    atomic_write_via_path(tmp_path / "LATEST", write_to)
    assert seen[0].suffix == ".tmp"
    assert (tmp_path / "LATEST").read_text() == "x"
    assert _listing(tmp_path) == ["LATEST"]


def test_via_path_failure_after_writing_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "plot.png"
    target.write_bytes(b"old image")

    def write_to(temp: Path) -> None:
        temp.write_bytes(b"new half image")
        raise WriterFailed("savefig broke")

    with pytest.raises(WriterFailed):
        atomic_write_via_path(target, write_to)
    assert target.read_bytes() == b"old image"
    assert _listing(tmp_path) == ["plot.png"]


def test_via_path_writer_that_writes_nothing_fails_and_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("{}")
    with pytest.raises(FileNotFoundError):
        atomic_write_via_path(target, lambda temp: None)  # nothing at the temp path to fsync or rename
    assert target.read_text() == "{}"
    assert _listing(tmp_path) == ["out.json"]


# ---- atomic_directory / replace_directory -------------------------------------------------------------------------


def test_atomic_directory_creates_the_folder_from_the_temp(tmp_path: Path) -> None:
    final = tmp_path / "ckpt" / "step_3"
    with atomic_directory(final) as temp:
        assert temp.parent == final.parent and temp != final and temp.is_dir()
        assert is_temp_name(temp.name)
        assert not final.exists()  # nothing visible under the final name while filling
        (temp / "model.bin").write_bytes(b"weights")
        (temp / "sub").mkdir()
        (temp / "sub" / "state.json").write_text("{}")
    assert _tree(final) == {"model.bin": b"weights", "sub/state.json": b"{}"}
    assert _listing(final.parent) == ["step_3"]


def test_atomic_directory_replaces_an_existing_folder_not_merges(tmp_path: Path) -> None:
    final = tmp_path / "step_3"
    final.mkdir()
    (final / "stale.bin").write_bytes(b"old only")
    (final / "model.bin").write_bytes(b"old weights")
    with atomic_directory(final) as temp:
        (temp / "model.bin").write_bytes(b"new weights")
    assert _tree(final) == {"model.bin": b"new weights"}  # stale.bin is gone: replaced, not merged
    assert _listing(tmp_path) == ["step_3"]  # no trash folder left behind


def test_atomic_directory_exception_keeps_the_old_folder_and_removes_the_temp(tmp_path: Path) -> None:
    final = tmp_path / "step_3"
    final.mkdir()
    (final / "model.bin").write_bytes(b"old weights")
    with pytest.raises(WriterFailed):
        with atomic_directory(final) as temp:
            (temp / "model.bin").write_bytes(b"half new")
            (temp / "extra.bin").write_bytes(b"x")
            raise WriterFailed
    assert _tree(final) == {"model.bin": b"old weights"}
    assert _listing(tmp_path) == ["step_3"]


def test_atomic_directory_exception_without_an_old_folder_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(WriterFailed):
        with atomic_directory(tmp_path / "new_dir") as temp:
            (temp / "f").write_text("x")
            raise WriterFailed
    assert _listing(tmp_path) == []


def test_replace_directory_onto_a_missing_and_an_existing_target(tmp_path: Path) -> None:
    first = tmp_path / "filled_1"
    first.mkdir()
    (first / "a").write_text("1")
    final = tmp_path / "final"
    replace_directory(first, final)
    assert _tree(final) == {"a": b"1"} and not first.exists()

    second = tmp_path / "filled_2"
    second.mkdir()
    (second / "b").write_text("2")
    replace_directory(second, final)
    assert _tree(final) == {"b": b"2"}  # "a" did not survive: replaced, not merged
    assert _listing(tmp_path) == ["final"]


# ---- is_temp_name -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (".model.bin.tmp-abc123", True),
        (".step_3.tmp-x9", True),
        (".metrics.jsonl.tmp-q.jsonl", True),
        ("model.bin", False),
        ("step_3", False),
        (".hidden", False),  # dot file, but not one of ours
        ("model.tmp-abc", False),  # our mark, but not a dot name
        ("", False),
    ],
)
def test_is_temp_name(name: str, expected: bool) -> None:
    assert is_temp_name(name) is expected


def test_directory_temps_are_recognised(tmp_path: Path) -> None:
    names: list[str] = []
    for _ in range(2):
        with atomic_directory(tmp_path / "d") as temp:
            names.append(temp.name)
    assert all(is_temp_name(n) for n in names) and names[0] != names[1]
    assert _listing(tmp_path) == ["d"]


# ---- a writer killed mid-write (no Python clean-up runs) ----------------------------------------------------------

_KILLED_WRITER = """
import os, sys
from dapo.infra.atomic import atomic_write

def write(f):
    f.write(b"half of the new content")
    f.flush()
    os._exit(9)

atomic_write(sys.argv[1], write)
"""


def _kill_a_writer_of(target: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target)], capture_output=True, timeout=60)
    assert proc.returncode == 9, proc.stderr.decode()


def test_killed_writer_leaves_the_old_file_untouched(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    _kill_a_writer_of(target)
    assert target.read_text() == "old"
    assert "out.txt" in _listing(tmp_path)


def test_killed_writer_leftover_is_recognised_as_a_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    _kill_a_writer_of(target)
    leftovers = [n for n in _listing(tmp_path) if n != "out.txt"]
    assert leftovers and all(is_temp_name(n) for n in leftovers), leftovers  # what checkpoint clean-up looks for


def test_next_write_after_a_killed_writer_succeeds(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    _kill_a_writer_of(target)
    atomic_write(target, "new")
    assert target.read_text() == "new"
