"""Reading back the run configuration saved in a checkpoint (``config.yaml``), which a resume compares its own with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dapo.infra.checkpoint.layout import CONFIG_NAME


def checkpoint_config(path: Path) -> dict[str, Any] | None:
    """The configuration saved with the checkpoint at ``path`` (its ``config.yaml``), or None: a checkpoint written
    before configurations were saved with checkpoints, or without one, or one whose file is not a YAML mapping."""
    try:
        saved = yaml.safe_load((Path(path) / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return saved if isinstance(saved, dict) else None
