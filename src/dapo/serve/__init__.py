"""Serving a model behind an OpenAI-compatible API (Ray Serve; HF engine or vLLM).

``dapo serve MODEL`` or ``serve run dapo.serve:build_app model=PATH tensor-parallel-size=N``. See docs/serving.md.
Ray is imported only by :func:`build_app`, so the protocol and server logic work without it.
"""

from __future__ import annotations

from typing import Any

from dapo.serve.config import ServeConfig, ServeConfigError

__all__ = ["ServeConfig", "ServeConfigError", "build_app", "ray_serve_available"]


def ray_serve_available() -> tuple[bool, str]:
    """(True, "") when Ray Serve can be imported, else (False, what to install)."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as e:
        return False, f"Ray Serve is not installed ({e}); pip install 'ray[serve]'"
    return True, ""


def build_app(args: dict[str, Any] | None = None, **kwargs: Any):
    """The Ray Serve application (see :mod:`dapo.serve.ray_app`)."""
    ok, reason = ray_serve_available()
    if not ok:
        raise ImportError(reason)
    from dapo.serve.ray_app import build_app as _build

    return _build(args, **kwargs)
