"""The name a model folder is reported and served under (``dapo eval``'s table and output file, ``dapo serve``'s
``model`` id).

A checkpoint's model folder is always called ``hf`` (``<run>/checkpoints/global_step_N/hf``, a LoRA run's merged model
``.../hf/merged``), so its own name says nothing: it is named ``<run>-global_step_N`` instead, which tells the
checkpoints of one run, and of two runs, apart."""

from __future__ import annotations

from pathlib import Path

EMBEDDED_MODEL_NAME = "tiny-qwen2"


def model_name(model: str | None) -> str:
    """``<run>-global_step_N`` for a checkpoint's ``hf`` (or ``hf/merged``) folder, ``global_step_N`` for one outside
    a ``checkpoints`` folder, else the folder's name; ``tiny-qwen2`` for the embedded model (``None``)."""
    if not model:
        return EMBEDDED_MODEL_NAME
    folder = Path(model.rstrip("/"))
    if folder.match("global_step_*/hf/merged"):  # the checkpoint's folder name, not an engine's
        folder = folder.parent
    if folder.match("global_step_*/hf"):
        step = folder.parent
        return f"{step.parent.parent.name}-{step.name}" if step.parent.name == "checkpoints" else step.name
    return folder.name or model
