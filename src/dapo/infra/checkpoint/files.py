"""Listing a checkpoint folder's files and encoding its JSON files: the two things the manifest, both saves and the
Hugging Face export must do the same way (the manifest lists exactly what the listing finds)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _files_under(root: Path) -> Iterator[Path]:
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            yield Path(dirpath) / filename


def relative_files(root: Path) -> list[str]:
    return sorted(path.relative_to(root).as_posix() for path in _files_under(root))


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode("utf-8")
