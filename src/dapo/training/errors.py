"""The one error a training run stops with when the message, not a traceback, is what the user needs."""


class TrainingError(RuntimeError):
    """A run cannot continue; the message says why and what to change."""
