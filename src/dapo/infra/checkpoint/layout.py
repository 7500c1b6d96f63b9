"""The names of a checkpoint's folders and files: what every other module of the package writes, finds and reads.

Layout written under ``ckpt_root`` (normally ``run_dir/checkpoints``)::

    ckpt_root/
      latest_checkpointed_iteration.txt   # step of the newest complete checkpoint (verl convention)
      global_step_{N}/
        hf/                  # model.save_pretrained (safetensors) + tokenizer.save_pretrained:
                             # loadable by AutoModelForCausalLM.from_pretrained and by vLLM
        optimizer.pt         # optimizer.state_dict()
        scheduler.pt         # scheduler.state_dict() (absent when there is no scheduler)
        rng.pt               # python `random`, numpy, torch CPU and (when available) CUDA RNG states
        trainer_state.json   # the JSON-exact part of the trainer's opaque state dict
        trainer_state.pt     # the rest of it (tensors, tuples, int-keyed dicts ...), absent when empty
        config.yaml          # the configuration of the run that made this checkpoint (absent when not given)
        manifest.json        # written LAST: every other file with its size in bytes and its SHA-256

A sharded checkpoint (``save_sharded``) has ``sharded/`` (the DCP files of every rank) and ``rng_rank{r}.pt`` (each
rank's RNG) instead of ``optimizer.pt`` and ``rng.pt``. A save in progress is a hidden ``.tmp-`` folder next to the
final one; such a folder (or an ``.old-`` one) is never a complete checkpoint, and the next save removes it.
"""

from __future__ import annotations

import re

MANIFEST_NAME = "manifest.json"
CONFIG_NAME = "config.yaml"  # the run's configuration when the checkpoint was made
LATEST_FILE_NAME = "latest_checkpointed_iteration.txt"
SHARDED_LAYOUT = "sharded"  # the manifest's "layout" in the sharded format (absent: the full format)
SHARDED_DIR = "sharded"  # the DCP folder of a sharded checkpoint

STEP_DIR_RE = re.compile(r"^global_step_(\d+)$")
TEMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".old-"


def checkpoint_dir_name(step: int) -> str:
    """Folder name of the checkpoint taken after optimizer step ``step``."""
    return f"global_step_{step}"


def rank_rng_name(rank: int) -> str:
    """A sharded checkpoint's RNG file of ``rank``: every rank keeps its own streams (a CUDA RNG is per device)."""
    return f"rng_rank{rank}.pt"
