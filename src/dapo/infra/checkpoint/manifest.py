"""The manifest (``manifest.json``, written last) and what it proves: which folders are checkpoints, and intact.

A checkpoint counts as *complete* only when its manifest is present and every file it lists has the recorded size,
so a folder left by a crash, a full disk or a half-copied directory is never picked for resuming. A checkpoint
*verifies* when, in addition, every file has its recorded SHA-256, so a file that kept its size but not its content
(bit rot, a stray write) is caught before anything parses it. Hashing reads every file once more (about 1 GB/s), a
cost paid at save and at resume, not per step. Manifests written before checksums were recorded are verified by size
only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dapo.infra.checkpoint.files import relative_files
from dapo.infra.checkpoint.layout import MANIFEST_NAME, STEP_DIR_RE

MANIFEST_FORMAT = "dapo-checkpoint/1"


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_entries(root: Path, rels: list[str]) -> dict[str, dict[str, Any]]:
    """The manifest entry (size in bytes, SHA-256) of each of ``rels`` under ``root``."""
    return {rel: {"size": (root / rel).stat().st_size, "sha256": _sha256(root / rel)} for rel in rels}


def manifest_problem(path: Path, *, verify: bool = False, within: str | None = None) -> str | None:
    """None when ``path`` is a complete checkpoint (and, with ``verify``, every checksum matches), else why not.

    ``within``: a folder of the checkpoint (``hf``, ``hf/merged``) whose files alone are checked, where a file the
    manifest does not list is a problem too (what loads a model from that folder would read it)."""
    if not path.is_dir():
        return "not a folder"
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        return f"no {MANIFEST_NAME} (the save never finished)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST_NAME}: {exc}"
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return f"{MANIFEST_NAME} is not a {MANIFEST_FORMAT} manifest"
    match = STEP_DIR_RE.match(path.name)
    if match and manifest.get("step") != int(match.group(1)):
        return f"{MANIFEST_NAME} says step {manifest.get('step')!r} but the folder is {path.name}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST_NAME} lists no files"
    if within is not None:
        files = {rel: meta for rel, meta in files.items() if rel.startswith(f"{within}/")}
        on_disk = (f"{within}/{rel}" for rel in relative_files(path / within))
        unlisted = sorted(rel for rel in on_disk if rel not in files)
        if unlisted:
            return f"{unlisted[0]} is not in its {MANIFEST_NAME} (it was added after the save)"
    for rel, meta in files.items():
        file = path / rel
        if not file.is_file():
            return f"{rel} is missing"
        size = file.stat().st_size
        if not isinstance(meta, dict) or size != meta.get("size"):
            return f"{rel} has {size} bytes, the manifest says {meta.get('size') if isinstance(meta, dict) else meta!r}"
    if verify:
        for rel, meta in files.items():
            expected = meta.get("sha256")
            if expected is not None and _sha256(path / rel) != expected:
                return f"{rel} does not match its checksum in {MANIFEST_NAME} (its content changed after the save)"
    return None


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a checkpoint that :func:`manifest_problem` already accepted."""
    return json.loads((path / MANIFEST_NAME).read_text(encoding="utf-8"))


def is_complete_checkpoint(path: Path) -> bool:
    """True when ``path`` has a valid manifest and every listed file has its recorded size."""
    return manifest_problem(Path(path)) is None


def checkpoint_problems(ckpt_root: Path) -> dict[Path, str]:
    """Every ``global_step_N`` folder under ``ckpt_root`` that does not verify, with the reason."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return {}
    problems = {}
    for entry in sorted(ckpt_root.iterdir()):
        if STEP_DIR_RE.match(entry.name):
            problem = manifest_problem(entry, verify=True)
            if problem is not None:
                problems[entry] = problem
    return problems


def checkpoint_folder_problem(folder: Path) -> tuple[Path, str] | None:
    """Whether a model folder inside a checkpoint (``global_step_N/hf``, ``hf/merged``) holds the files that save
    wrote: None when ``folder`` is in no dapo checkpoint (a plain Hugging Face folder) or every file under it matches
    the manifest (size and SHA-256, the check a resume makes) and none was added; else the checkpoint and why not.

    The checkpoint is the nearest enclosing folder with a dapo ``manifest.json`` (or a ``global_step_N`` folder with
    any ``manifest.json``, which is then checked as a resume would). Hashing reads the folder once (about 1 GB/s)."""
    folder = Path(folder).resolve()
    for ckpt in (folder, *folder.parents):
        manifest_path = ckpt / MANIFEST_NAME
        if not manifest_path.is_file():
            continue
        if not STEP_DIR_RE.match(ckpt.name):
            try:
                manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # another tool's file of that name
            if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
                continue
        within = folder.relative_to(ckpt).as_posix()
        problem = manifest_problem(ckpt, verify=True, within=None if within == "." else within)
        return None if problem is None else (ckpt, problem)
    return None
