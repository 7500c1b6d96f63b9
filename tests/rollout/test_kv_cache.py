"""The engine's KV caches: the preallocated layer holds what Transformers' DynamicLayer holds after the same appends,
row drops and growth past its capacity (in both key layouts), and a model decoding with it, or with the prompts kept
once for all their samples, gives the same logits as with Transformers' own cache."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from dapo.model.loading import EMBEDDED_MODEL_DIR
from dapo.model.attention import SHARED_PREFIX, SHARED_PREFIX_CACHE, attention_implementation, grouped_query_sdpa
from dapo.rollout.kv_cache import PreallocatedLayer, SharedPrefixLayer, preallocated_cache, shared_prompt_cache


@pytest.mark.parametrize("position_last", [False, True], ids=["keys-position-second", "keys-position-last"])
def test_appends_row_drops_and_growth_match_dynamic_layer(position_last: bool) -> None:
    g = torch.Generator().manual_seed(0)
    ours, theirs = PreallocatedLayer(capacity=4), DynamicLayer()
    ours.keys_position_last = position_last
    rows = 5
    for step, (length, drop) in enumerate([(3, None), (1, None), (1, [0, 2, 4]), (2, None), (1, [2]), (4, None)]):
        if drop is not None:
            rows = len(drop)
            for layer in (ours, theirs):
                layer.batch_select_indices(torch.tensor(drop))
        keys = torch.randn(rows, 2, length, 8, generator=g)
        values = torch.randn(rows, 2, length, 8, generator=g)
        got, want = ours.update(keys, values), theirs.update(keys, values)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), f"step {step}"
        assert ours.get_seq_length() == theirs.get_seq_length()
    assert ours._value_buffer.shape[-2] >= 12 > 4  # grew (doubling) past the 4 positions it started with


def test_a_model_decodes_the_same_logits_with_the_preallocated_cache() -> None:
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, dtype=torch.float32)
    prompt = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    logits = {}
    for name, cache in (
        ("dynamic", DynamicCache(config=model.config)),
        ("preallocated", preallocated_cache(model.config, capacity=5)),
    ):
        assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers) == (name == "preallocated")
        steps = [model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1]]
        token = steps[-1].argmax(-1, keepdim=True)
        for _ in range(3):  # past the capacity of 5 positions
            steps.append(model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1])
            token = steps[-1].argmax(-1, keepdim=True)
        logits[name] = torch.stack(steps)
    torch.testing.assert_close(logits["preallocated"], logits["dynamic"], atol=1e-5, rtol=0)


def test_samples_decoding_on_one_copy_of_their_prompt_get_the_logits_of_copied_prompts() -> None:
    # two prompts, the second left-padded, with 3 and 2 samples; the samples drop out at different steps
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, dtype=torch.float32, attn_implementation="sdpa")
    ids = torch.tensor([[3, 4, 5, 6, 7], [0, 0, 8, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    row_to_prompt = torch.tensor([0, 0, 0, 1, 1])
    g = torch.Generator().manual_seed(0)
    steps = [torch.randint(11, 60, (5, 1), generator=g) for _ in range(6)]
    drops = {2: torch.tensor([0, 2, 3, 4]), 4: torch.tensor([1, 3])}  # positions in the batch still decoding
    logits: dict[str, list[torch.Tensor]] = {}
    with torch.inference_mode(), grouped_query_sdpa(model):
        for name in ("copied", "shared"):
            cache = preallocated_cache(model.config, capacity=5 if name == "shared" else 11)
            model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
            rows, row_mask, kwargs = torch.arange(5), mask[row_to_prompt], {}
            if name == "shared":
                cache = shared_prompt_cache(cache, mask.bool(), row_to_prompt, capacity=2)  # grows past 2
                assert all(isinstance(layer, SharedPrefixLayer) for layer in cache.layers)
                kwargs = {SHARED_PREFIX_CACHE: cache}
            else:
                cache.batch_select_indices(row_to_prompt)
            out = []
            for step, tokens in enumerate(steps):
                if step in drops:
                    rows, row_mask = rows[drops[step]], row_mask[drops[step]]
                    cache.batch_select_indices(drops[step])
                row_mask = torch.cat([row_mask, torch.ones(len(rows), 1, dtype=row_mask.dtype)], dim=-1)
                position = positions[row_to_prompt[rows], -1:] + 1 + step
                with attention_implementation(model, SHARED_PREFIX) if kwargs else contextlib.nullcontext():
                    step_logits = model(
                        input_ids=tokens[rows],
                        attention_mask=None if kwargs else row_mask,
                        position_ids=position,
                        past_key_values=cache,
                        use_cache=True,
                        **kwargs,
                    ).logits
                out.append(step_logits[:, -1])
            logits[name] = out
    for step, (shared, copied) in enumerate(zip(logits["shared"], logits["copied"], strict=True)):
        torch.testing.assert_close(shared, copied, atol=2e-5, rtol=0, msg=f"step {step}")
