"""The metric sinks, by the name ``trainer.logger`` gives them: the one list of logger names.

Adding a logger is one file (a class with ``name``, ``__init__(context)``, ``log``, ``close``;
dapo.infra.loggers.base) and one line here; docs/extending.md, "Add a logger". The order is the order the Tracker
opens and feeds them (the run record first). The config's list of accepted names (``TrainerConfig.logger``) is
checked against this registry by tests/infra/test_logger_registry.py.
"""

from __future__ import annotations

from dapo.infra.loggers.base import MetricLogger
from dapo.infra.loggers.console_logger import ConsoleLogger
from dapo.infra.loggers.jsonl_logger import JsonlLogger
from dapo.infra.loggers.tensorboard_logger import TensorBoardLogger
from dapo.infra.loggers.wandb_logger import WandbLogger

LOGGERS: dict[str, type[MetricLogger]] = {
    logger.name: logger for logger in (JsonlLogger, TensorBoardLogger, WandbLogger, ConsoleLogger)
}
LOGGER_NAMES: tuple[str, ...] = tuple(LOGGERS)
