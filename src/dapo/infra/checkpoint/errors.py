"""The error a save or load raises for what happened to the files (a full disk, a damaged or foreign checkpoint),
so a caller tells it apart from its own wrong arguments (``ValueError``, ``TypeError``)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded; the message says what happened and what is intact."""
