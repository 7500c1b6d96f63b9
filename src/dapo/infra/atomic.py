"""The one way this package writes a file or folder that someone will read later: all of it, or nothing.

Every writer (checkpoints, the dequantized-model cache, plots, metrics rewrites, data files) goes through here. A file
is written to a temporary sibling, flushed and fsynced, then ``os.replace``-d onto its name and the parent folder is
fsynced; a folder is filled under a temporary sibling name and renamed onto its final name the same way. A crash, a
full disk or an exception at any point leaves the old file or folder (if any) untouched and no temporary behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

TEMP_MARK = ".tmp-"


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Persist a folder's entries (new files, renames): the other half of a durable rename."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems refuse fsync on folders; the data itself is synced
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every folder, deepest first."""
    folders = []
    for dirpath, _dirnames, filenames in os.walk(root):
        folders.append(Path(dirpath))
        for name in filenames:
            fsync_file(Path(dirpath) / name)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(folder)


def write_new_file(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Create ``path`` (it must not exist), fill it through a Python file object, flush and fsync it.

    A Python file object, rather than a path handed to C++/Rust writers, keeps the real ``OSError`` (ENOSPC, EFBIG)
    in the exception chain, so a failure message can name it.
    """
    with open(path, "xb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _temp_sibling(path: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}", dir=path.parent)
    os.close(fd)
    os.unlink(name)
    return Path(name)


def atomic_write(path: str | Path, content: bytes | str | Callable[[IO[bytes]], Any]) -> Path:
    """Replace ``path`` with ``content`` (bytes, UTF-8 text, or a function writing to a binary file object)."""
    path = Path(path)
    if isinstance(content, str):
        content = content.encode("utf-8")
    write = (lambda f: f.write(content)) if isinstance(content, bytes) else content
    return atomic_write_via_path(path, lambda temp: write_new_file(temp, write))


def atomic_write_via_path(path: str | Path, write_to: Callable[[Path], Any]) -> Path:
    """Replace ``path`` with what ``write_to(temp_path)`` writes: for writers that want a path (parquet, savefig).

    The temporary file keeps the target's suffix so that writers choosing a format by extension choose the right one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sibling = _temp_sibling(path)
    temp = sibling.with_name(sibling.name + (path.suffix or ".tmp"))  # unique name, and the target's suffix last
    try:
        write_to(temp)
        fsync_file(temp)
        os.replace(temp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return path


def replace_directory(temp_dir: Path, final_dir: Path) -> None:
    """Rename a filled ``temp_dir`` onto ``final_dir``; an existing ``final_dir`` is replaced, never half-merged."""
    if not final_dir.exists():
        os.replace(temp_dir, final_dir)
    else:
        trash = _temp_sibling(final_dir)
        os.replace(final_dir, trash)
        os.replace(temp_dir, final_dir)
        shutil.rmtree(trash, ignore_errors=True)
    fsync_dir(final_dir.parent)


@contextlib.contextmanager
def atomic_directory(final_dir: str | Path) -> Iterator[Path]:
    """``with atomic_directory(d) as temp: ...fill temp...``: on success ``temp`` becomes ``d`` (fsynced); on an
    exception it is removed and ``d`` is left as it was."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}{TEMP_MARK}", dir=final_dir.parent))
    try:
        yield temp
        fsync_tree(temp)
        replace_directory(temp, final_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def is_temp_name(name: str) -> bool:
    """True for the temporary names this module creates (left behind only by a process killed mid-write)."""
    return name.startswith(".") and TEMP_MARK in name
