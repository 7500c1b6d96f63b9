"""Metric sinks, one class a backend (``trainer.logger`` names them): dapo.infra.loggers.registry lists them and
:class:`dapo.infra.tracking.Tracker` composes the chosen ones."""
