"""The rollout layer's errors, in a module of their own: the factory raises them and so do the engines it builds, so
neither needs to import the other for them (the factory imports the engines lazily; an engine never imports the
factory)."""

from __future__ import annotations


class EngineUnavailableError(RuntimeError):
    """The chosen engine cannot be built here; the message says what to install or change."""
