"""The one way this package writes a file or folder that someone will read later: all of it, or nothing.

Every writer (checkpoints, the dequantized-model cache, plots, metrics rewrites, data files) goes through here. A file
is written to a temporary sibling, flushed and fsynced, then ``os.replace``-d onto its name and the parent folder is
fsynced; a folder is filled under a temporary sibling name and renamed onto its final name the same way. A crash, a
full disk or an exception at any point leaves the old file or folder (if any) untouched and no temporary behind.

When a write (or read) fails, :func:`describe_os_error` is the one way to say so: one line naming the operation, its
path and the reason (the errno of an ``OSError`` anywhere in the exception chain), so no caller needs a traceback to
tell a full disk from a read-only folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

TEMP_MARK = ".tmp-"

_ERRNO_REASONS: dict[int, str] = {
    errno.ENOSPC: "no space left on device",
    errno.EFBIG: "file size limit exceeded (file too large)",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "input/output error",
    errno.ENOTDIR: "a component of the path is a file, not a folder",
    errno.EEXIST: "a file of that name is in the way",
}
_OS_ERROR_IN_TEXT_RE = re.compile(r"os error (\d+)")


def os_error_reason(exc: BaseException) -> str:
    """A short human reason, using the errno of an ``OSError`` anywhere in the exception chain.

    torch.save reports write failures as RuntimeError with the OSError as context; safetensors (Rust) reports them as
    text ending in "(os error N)". Without any errno the exception's own type and text are the reason.
    """
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno is not None:
            return _ERRNO_REASONS.get(link.errno, f"{link.strerror or type(link).__name__} (errno {link.errno})")
        match = _OS_ERROR_IN_TEXT_RE.search(str(link))
        if match:
            code = int(match.group(1))
            return _ERRNO_REASONS.get(code, f"{os.strerror(code)} (errno {code})")
    return f"{type(exc).__name__}: {exc}"


def describe_os_error(exc: BaseException, operation: str) -> str:
    """``"<operation> failed: <reason>"``: the one-line message of a filesystem failure. ``operation`` names the path
    (``"writing the plot runs/x/plots/training.png"``); the reason comes from :func:`os_error_reason`."""
    return f"{operation} failed: {os_error_reason(exc)}"


class FileOperationError(OSError):
    """A read or write of a file failed; ``str()`` is the one-line message naming the operation, path and reason.

    An ``OSError`` (same errno), so code that handles filesystem errors keeps handling it; the writers of this package
    raise it after removing whatever they had half-written.
    """

    def __init__(self, exc: BaseException, operation: str) -> None:
        code = next((e.errno for e in _chain(exc) if isinstance(e, OSError) and e.errno is not None), None)
        super().__init__(code, os_error_reason(exc))
        self.operation = operation
        self.message = describe_os_error(exc, operation)

    def __str__(self) -> str:
        return self.message


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


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
    atomic_write_files([(path, write_to)])
    return path


def atomic_write_files(writes: Sequence[tuple[Path, Callable[[Path], Any]]]) -> None:
    """Replace several files together, ``[(path, write_to), ...]``: every temporary is written and fsynced before the
    first rename, so a failure while writing (a full disk at the second file) leaves every old file as it was and no
    temporary behind. Only the renames themselves (metadata, not data) can fail between two of them."""
    temps: list[tuple[Path, Path]] = []
    try:
        for path, write_to in writes:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            sibling = _temp_sibling(path)
            temp = sibling.with_name(sibling.name + (path.suffix or ".tmp"))  # unique, and the target's suffix last
            temps.append((temp, path))
            write_to(temp)
            fsync_file(temp)
        for temp, path in temps:
            os.replace(temp, path)
        for folder in dict.fromkeys(path.parent for _, path in temps):
            fsync_dir(folder)
    except BaseException:
        for temp, _ in temps:
            with contextlib.suppress(OSError):
                temp.unlink()
        raise


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
