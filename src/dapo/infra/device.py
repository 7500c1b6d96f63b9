"""Which device a command runs on: the one resolution of ``auto`` (``trainer.device``, ``dapo eval/generate/serve
--device``), so that every command picks the same device on the same machine."""

from __future__ import annotations

DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> str:
    """``auto``: ``cuda`` where torch sees a GPU, else ``cpu``; any other name as it is (the caller checks it)."""
    if name != "auto":
        return name
    import torch  # here, not at the top: the CLI reads DEVICE_CHOICES without loading torch

    return "cuda" if torch.cuda.is_available() else "cpu"
