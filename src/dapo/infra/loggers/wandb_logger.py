"""Weights & Biases (imported when chosen). ``wandb_mode="offline"`` or ``WANDB_MODE`` works without a network; the
run id is kept in ``run_dir/wandb_run_id.txt`` so a resumed run continues the same W&B run."""

from __future__ import annotations

import math
import secrets
import string
from typing import Any, ClassVar

from dapo.infra.loggers.base import RunContext, Values

WANDB_ID_FILE = "wandb_run_id.txt"


class WandbLogger:
    name: ClassVar[str] = "wandb"

    def __init__(self, context: RunContext) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(
                "Tracker backend 'wandb' needs the wandb package, which is not installed: "
                "pip install 'dapo[wandb]' (or drop 'wandb' from the tracking backends)"
            ) from exc
        id_file = context.run_dir / WANDB_ID_FILE
        if id_file.is_file():
            run_id = id_file.read_text(encoding="utf-8").strip()
        else:  # W&B run ids: short, lowercase alphanumeric
            run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        kwargs: dict[str, Any] = {
            "project": context.project,
            "name": context.experiment,
            "config": dict(context.config),
            "dir": str(context.run_dir),
            "id": run_id,
            "resume": "allow",
        }
        if context.wandb_mode is not None:
            kwargs["mode"] = context.wandb_mode
        self._run: Any = wandb.init(**kwargs)
        if not id_file.is_file():
            id_file.write_text(run_id + "\n", encoding="utf-8")

    def log(self, values: Values, step: int) -> None:
        self._run.log({k: (math.nan if v is None else v) for k, v in values.items()}, step=step)

    def close(self) -> None:
        self._run.finish()
