"""Hugging Face Hub ids for ``model.path`` and data files, resolved through the local Hugging Face cache.

``Qwen/Qwen2.5-Math-7B`` (a model repo) and ``BytedTsinghua-SIA/DAPO-Math-17k`` (a dataset repo, optionally with a
file inside it: ``BytedTsinghua-SIA/AIME-2024/data/aime-2024.parquet``) are looked up in the cache first; when the
cache lacks them and the network is allowed they are downloaded into it (``huggingface_hub.snapshot_download``). With
``HF_HUB_OFFLINE=1`` (or no network) a missing id stops with a message that says how to fetch it. An existing local
path always wins over a Hub id of the same spelling.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dapo.config import DataConfig

__all__ = [
    "HubResolveError",
    "looks_like_hub_id",
    "looks_like_model_id",
    "resolve_data_config",
    "resolve_data_file",
    "resolve_model_path",
]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(/.+)?$")
_DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


class HubResolveError(RuntimeError):
    """A Hub id could not be resolved; the message says which, why, and how to fetch it."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def looks_like_hub_id(path: str) -> bool:
    """``owner/name`` (or ``owner/name/file``) that is no local path: not existing, not absolute or ``./``-relative,
    its first component no local folder, and not ``folder/file.parquet`` (a dataset repo name has no data suffix)."""
    if not path or Path(path).expanduser().exists() or path.startswith((".", "/", "~")) or "\\" in path:
        return False
    parts = path.split("/")
    if Path(parts[0]).is_dir() or (len(parts) == 2 and parts[1].endswith(_DATA_SUFFIXES)):
        return False
    return bool(_HUB_ID.match(path))


def looks_like_model_id(path: str) -> bool:
    """``owner/name`` exactly: a model repo id has no file part, so ``a/b/c`` is a missing local path, not an id."""
    return looks_like_hub_id(path) and path.count("/") == 1


def _snapshot(repo_id: str, repo_type: str, cache_dir: str | Path | None, allow: list[str] | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    offline = _offline()
    try:
        return Path(
            snapshot_download(
                repo_id, repo_type=repo_type, cache_dir=cache_dir, allow_patterns=allow, local_files_only=True
            )
        )
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        cached_error = exc
    kind = "dataset" if repo_type == "dataset" else "model"
    fetch = f"huggingface-cli download {repo_id}" + (" --repo-type dataset" if kind == "dataset" else "")
    if offline:
        raise HubResolveError(
            f"no local path '{repo_id}', and as a Hub id: {kind} '{repo_id}' is not in the Hugging Face cache and "
            f"HF_HUB_OFFLINE is set, so it cannot be "
            f"downloaded. Fetch it on a machine with a network ({fetch}) and copy the cache "
            f"(HF_HOME, default ~/.cache/huggingface), or pass a local folder/file path instead"
        ) from cached_error
    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, cache_dir=cache_dir, allow_patterns=allow))
    except Exception as exc:  # network errors, 401/404: all reported the same way
        raise HubResolveError(
            f"no local path '{repo_id}', and as a Hub id: {kind} '{repo_id}' is not in the Hugging Face cache and "
            f"downloading it failed ({type(exc).__name__}: "
            f"{exc}). Check the id and the network, run `{fetch}`, or pass a local path"
        ) from exc


def resolve_model_path(path: str, *, cache_dir: str | Path | None = None) -> Path:
    """A local folder for ``model.path``: the path itself, or the cached snapshot of a Hub model id."""
    if not looks_like_model_id(path):
        return Path(path).expanduser()
    return _snapshot(path, "model", cache_dir, None)


def resolve_data_file(path: str, *, cache_dir: str | Path | None = None) -> list[Path]:
    """Local files for one ``data.train_files``/``val_files`` entry: the path itself, the named file of a Hub
    dataset (``owner/name/dir/file.parquet``), or every parquet/JSONL file of a Hub dataset (``owner/name``)."""
    if not looks_like_hub_id(path):
        return [Path(path).expanduser()]
    owner, name, *rest = path.split("/")
    repo_id, inner = f"{owner}/{name}", "/".join(rest)
    root = _snapshot(repo_id, "dataset", cache_dir, [inner] if inner else None)
    if inner:
        target = root / inner
        if not target.is_file():
            raise HubResolveError(f"dataset '{repo_id}' has no file '{inner}' (in {root})")
        return [target]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _DATA_SUFFIXES)
    if not files:
        raise HubResolveError(
            f"dataset '{repo_id}' holds no .parquet/.jsonl/.json file (in {root}); name one: "
            f"{repo_id}/path/in/repo.parquet"
        )
    return files


def resolve_data_config(data: DataConfig, *, cache_dir: str | Path | None = None) -> DataConfig:
    """``data`` with every Hub id of ``train_files``/``val_files`` replaced by its local files (others unchanged)."""

    def files(entries: list[str]) -> list[str]:
        return [str(f) for entry in entries for f in resolve_data_file(entry, cache_dir=cache_dir)]

    return data.model_copy(update={"train_files": files(data.train_files), "val_files": files(data.val_files)})
