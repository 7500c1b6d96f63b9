"""Atomic, resumable training checkpoints: one package, one module per concern; callers import from here.

A checkpoint is a ``ckpt_root/global_step_{N}`` folder (``layout``: every file and folder name) written in one
transaction (``transaction``: temp folder, manifest LAST, one atomic rename), so a crash never leaves a folder that
counts as a checkpoint. Its ``manifest.json`` lists every file with its size and SHA-256 (``manifest``): a checkpoint is
*complete* when the sizes match and *verifies* when the checksums match too; resuming takes the newest one that
verifies (``discovery``) and loading refuses one that does not (``load``), so a file that kept its size but not its
content never reaches ``json.loads`` or safetensors. Old checkpoints are rotated so that the newest ``keep_last`` good
ones remain (``rotation``).

Resume equality: ``load_checkpoint`` restores parameters, optimizer and scheduler state and every RNG stream
(``rng``) exactly, so continuing training after a load gives bit-identical parameters to a run that was never
interrupted (on CPU; CUDA kernels may add their own non-determinism).

Two formats for the model and optimizer (``trainer.checkpoint_format``; docs/checkpoints.md): full
(``save_full``: one process writes the full state, which a sharded caller gathers onto rank 0 first) and sharded
(``save_sharded``: every rank writes its own shards with ``torch.distributed.checkpoint``, and rank 0 streams a
Hugging Face export, ``hf_export``). Either loads on any world size and strategy (``load``).

Security: every ``.pt`` file is read with ``torch.load(weights_only=True)``, so loading a checkpoint never runs
pickled code; a save checks that its state files can be read back that way, so an unrestorable state fails on save,
not on resume.
"""

from dapo.infra.checkpoint.discovery import find_latest_checkpoint
from dapo.infra.checkpoint.errors import CheckpointError
from dapo.infra.checkpoint.layout import LATEST_FILE_NAME, MANIFEST_NAME, SHARDED_LAYOUT, checkpoint_dir_name
from dapo.infra.checkpoint.load import load_checkpoint
from dapo.infra.checkpoint.manifest import (
    MANIFEST_FORMAT,
    checkpoint_folder_problem,
    checkpoint_problems,
    is_complete_checkpoint,
)
from dapo.infra.checkpoint.rotation import rotate_checkpoints
from dapo.infra.checkpoint.save_full import save_checkpoint
from dapo.infra.checkpoint.save_sharded import save_sharded_checkpoint
from dapo.infra.checkpoint.saved_config import checkpoint_config

__all__ = [
    "LATEST_FILE_NAME",
    "SHARDED_LAYOUT",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "CheckpointError",
    "checkpoint_config",
    "checkpoint_dir_name",
    "checkpoint_folder_problem",
    "checkpoint_problems",
    "find_latest_checkpoint",
    "is_complete_checkpoint",
    "load_checkpoint",
    "rotate_checkpoints",
    "save_checkpoint",
    "save_sharded_checkpoint",
]
