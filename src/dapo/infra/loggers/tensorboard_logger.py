"""TensorBoard scalars in ``run_dir/tensorboard`` (the config as text at step 0); a null value is logged as NaN."""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

from dapo.infra.loggers.base import RunContext, Values


class TensorBoardLogger:
    name: ClassVar[str] = "tensorboard"

    def __init__(self, context: RunContext) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer: Any = SummaryWriter(log_dir=str(context.run_dir / "tensorboard"))
        config_text = json.dumps(dict(context.config), indent=2, default=str)
        self._writer.add_text("config", f"```\n{config_text}\n```", global_step=0)
        self._writer.flush()

    def log(self, values: Values, step: int) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, math.nan if value is None else value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
