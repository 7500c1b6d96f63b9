"""The checkpoint tests' tokenizer, optimizer, training step and comparisons; their model is
:func:`tests.harness.models.tiny_qwen2` at the ``CHECKPOINT`` shape.

Also imported by ``checkpoint_worker.py``, which the crash / full-disk tests run as a subprocess (with the repository
root on its ``PYTHONPATH``, for ``tests.harness``).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast

from tests.harness.models import CHECKPOINT, tiny_qwen2

VOCAB_WORDS = 60


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``w0 .. w59`` plus ``<unk>`` and ``<eos>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB_WORDS)}
    vocab["<unk>"] = VOCAB_WORDS
    vocab["<eos>"] = VOCAB_WORDS + 1
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")


def make_optimizer(model: torch.nn.Module) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW + a warmup LambdaLR, the pair the trainer checkpoints."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    return optimizer, scheduler


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> None:
    """One update whose data, dropout masks and noise all come from the torch CPU RNG."""
    import random

    import numpy as np

    model.train()
    input_ids = torch.randint(0, model.config.vocab_size, (2, 8))
    loss = model(input_ids=input_ids, labels=input_ids).loss
    # python and numpy RNG draws too, so resume must restore those streams as well
    loss = loss * (1.0 + 0.1 * random.random()) + 0.01 * float(np.random.rand()) * loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Bit-equal state dicts, key by key."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def assert_resumed_run_continues_as(path: object, reference: torch.nn.Module, steps: int) -> None:
    """Load the checkpoint at ``path`` (written after step 2) into other weights and a fresh optimizer, train
    ``steps`` more steps, and require ``reference``'s parameters bit for bit."""
    from dapo.infra.checkpoint import load_checkpoint

    resumed = tiny_qwen2(123, CHECKPOINT)
    optimizer, scheduler = make_optimizer(resumed)
    assert load_checkpoint(path, model=resumed, optimizer=optimizer, scheduler=scheduler) == {"step": 2}
    for _ in range(steps):
        train_step(resumed, optimizer, scheduler)
    assert_same_params(reference, resumed)
