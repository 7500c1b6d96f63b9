"""Test helpers for dapo.rollout: the engine model's token ids, a teacher-forced log-prob reference, a forward hook
that counts the rows each forward pass computes, and the engine contract on one output. The model itself is
:func:`tests.harness.models.tiny_qwen2` (its default shape, ``ENGINE``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import Qwen2ForCausalLM

from dapo.rollout.base import RolloutOutput, SamplingParams
from dapo.rollout.sampler import truncate_logits
from tests.harness.models import ENGINE

VOCAB, EOS, PAD = ENGINE["vocab_size"], ENGINE["eos_token_id"], ENGINE["pad_token_id"]


def teacher_forced_logprobs(
    model: Qwen2ForCausalLM,
    prompt: Sequence[int],
    response: Sequence[int],
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
) -> torch.Tensor:
    """log_softmax(truncate(logits / temperature)) of each response token (the distribution it was sampled from),
    from one unpadded forward over prompt + response; no truncation with the defaults."""
    ids = torch.tensor([list(prompt) + list(response)])
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature
    model.train(was_training)
    logits = truncate_logits(logits, top_k=top_k, top_p=top_p)
    logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


class ForwardRowCounter:
    """Forward hook recording the batch size (rows) and sequence length of every forward pass of a model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[tuple[int, int]] = []
        self._handle = model.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        self.calls.append((int(input_ids.shape[0]), int(input_ids.shape[1])))

    def remove(self) -> None:
        self._handle.remove()


def assert_well_formed(
    output: RolloutOutput, num_prompts: int, params: SamplingParams, stop_ids: set[int], vocab_size: int | None = None
) -> None:
    """The engine contract on one output: layout, lengths, log-probs <= 0, stop token last and only last,
    "length" exactly at max_tokens; token ids inside the vocabulary when ``vocab_size`` is given."""
    assert len(output) == num_prompts * params.n
    assert output.prompt_index == [i for i in range(num_prompts) for _ in range(params.n)]
    for ids, logprobs, reason in zip(output.response_ids, output.logprobs, output.finish_reason):
        assert len(ids) == len(logprobs) >= 1
        if vocab_size is not None:
            assert all(0 <= t < vocab_size for t in ids)
        assert all(lp <= 0.0 for lp in logprobs)
        assert not any(t in stop_ids for t in ids[:-1]), "a stop token must end the response"
        if reason == "stop":
            assert ids[-1] in stop_ids
        else:
            assert reason == "length" and len(ids) == params.max_tokens and ids[-1] not in stop_ids
