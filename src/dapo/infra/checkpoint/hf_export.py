"""Streaming full tensors into a Hugging Face folder, at most one safetensors file's worth in memory at a time.

A sharded save still writes ``hf/`` (what ``from_pretrained``, vLLM and ``dapo eval`` load), but its full model never
sits in one process: every rank gathers one tensor at a time and rank 0 buffers at most ``HF_SHARD_BYTES`` of them
before writing a file, so its extra memory is bounded whatever the model size.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dapo.infra.atomic import os_error_reason, write_new_file
from dapo.infra.checkpoint.files import json_bytes

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

HF_SHARD_BYTES = 2 * 1024**3  # the most tensor bytes rank 0 holds while streaming the hf/ export of a sharded save


def write_hf_export(
    folder: Path | None,
    tensors: Iterator[tuple[str, torch.Tensor]],
    hf_model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    max_shard_bytes: int,
) -> str | None:
    """Write ``tensors`` (name, full tensor) as a Hugging Face folder, holding at most one shard's worth at a time.

    ``folder`` None (not rank 0): only drain the iterator. Returns None, or why the export failed; the iterator is
    always drained to its end. The files are those ``save_pretrained`` writes: ``model.safetensors`` (or
    ``model-0000k-of-0000N.safetensors`` plus ``model.safetensors.index.json``), ``config.json``,
    ``generation_config.json`` and the tokenizer's files.
    """
    from safetensors.torch import save as safetensors_bytes

    failure: str | None = None
    written: list[tuple[str, list[str]]] = []  # (temp shard file name, its tensor names)
    bucket: dict[str, torch.Tensor] = {}
    bucket_bytes = 0
    total_bytes = 0

    def flush() -> None:
        nonlocal bucket, bucket_bytes
        shard = f"shard-{len(written):05d}.safetensors"
        data = safetensors_bytes(bucket, metadata={"format": "pt"})
        write_new_file(folder / shard, lambda f: f.write(data))
        written.append((shard, list(bucket)))
        bucket, bucket_bytes = {}, 0

    try:
        for name, tensor in tensors:
            if folder is None or failure is not None:
                continue
            try:
                if not bucket and not written:
                    folder.mkdir()
                tensor = tensor.detach().to("cpu", copy=True).contiguous()  # a copy: the gathered one can be freed
                nbytes = tensor.numel() * tensor.element_size()
                if bucket and bucket_bytes + nbytes > max_shard_bytes:
                    flush()
                bucket[name] = tensor
                bucket_bytes += nbytes
                total_bytes += nbytes
            except Exception as exc:
                failure = f"{os_error_reason(exc)} while writing hf/ (model weights)"
    except Exception as exc:  # the gathering itself failed (on every rank alike: it is a collective)
        return f"{os_error_reason(exc)} while gathering the full weights for hf/"
    if folder is None or failure is not None:
        return failure
    current = "hf/ (model weights)"
    try:
        if not written and not bucket:
            raise ValueError("the model has no tensors to export")
        if bucket:
            flush()
        count = len(written)
        final_names = (
            ["model.safetensors"]
            if count == 1
            else [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]
        )
        for (shard, _), final in zip(written, final_names, strict=True):
            os.replace(folder / shard, folder / final)
        if count > 1:
            index = {
                "metadata": {"total_size": total_bytes},
                "weight_map": {n: final for (_, names), final in zip(written, final_names, strict=True) for n in names},
            }
            write_new_file(folder / "model.safetensors.index.json", lambda f: f.write(json_bytes(index)))
        current = "hf/ (config)"
        config = copy.deepcopy(hf_model.config)
        config.architectures = [type(hf_model).__name__]  # as save_pretrained records it
        config.save_pretrained(folder)
        generation_config = getattr(hf_model, "generation_config", None)
        if generation_config is not None and hf_model.can_generate():
            generation_config.save_pretrained(folder)
        if tokenizer is not None:
            current = "hf/ (tokenizer files)"
            tokenizer.save_pretrained(folder)
    except Exception as exc:
        return f"{os_error_reason(exc)} while writing {current}"
    return None
