"""The engine's preallocated KV-cache layer holds what Transformers' DynamicLayer holds after the same appends, row
drops and growth past its capacity, and a model decoding with it gives the same logits."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from dapo.model.loading import EMBEDDED_MODEL_DIR
from dapo.rollout.hf_engine import PreallocatedLayer, preallocated_cache


def test_appends_row_drops_and_growth_match_dynamic_layer() -> None:
    g = torch.Generator().manual_seed(0)
    ours, theirs = PreallocatedLayer(capacity=4), DynamicLayer()
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
    assert ours._key_buffer.shape[-2] >= 12 > 4  # grew (doubling) past the 4 positions it started with


def test_a_model_decodes_the_same_logits_with_the_preallocated_cache() -> None:
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR, dtype=torch.float32)
    prompt = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    logits = {}
    for name, cache in (("dynamic", DynamicCache(config=model.config)),
                        ("preallocated", preallocated_cache(model.config, capacity=5))):
        assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers) == (name == "preallocated")
        steps = [model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1]]
        token = steps[-1].argmax(-1, keepdim=True)
        for _ in range(3):  # past the capacity of 5 positions
            steps.append(model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1])
            token = steps[-1].argmax(-1, keepdim=True)
        logits[name] = torch.stack(steps)
    torch.testing.assert_close(logits["preallocated"], logits["dynamic"], atol=1e-5, rtol=0)
