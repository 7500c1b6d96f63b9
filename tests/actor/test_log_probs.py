"""Packed and padded, chunked log-probs equal those of plain per-sample Hugging Face forwards, in value and in
gradient; the layout ``auto`` resolves to is the fast one for the attention implementation."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import Tensor, nn

from actor_helpers import VOCAB, actor_config, random_batch
from dapo.actor.batch import TrainBatch
from dapo.actor.log_probs import (
    compute_log_probs_and_entropy_batch,
    compute_log_probs_batch,
    compute_response_log_probs,
    LAYOUTS,
    decoder_and_lm_head,
    pack_sequences,
    pad_sequences,
    resolve_layout,
    share_prompt_sequences,
)
from tests.harness.models import ACTOR, tiny_qwen2
from tests.model.families import build_tiny_model


def reference(model: nn.Module, batch: TrainBatch, temperature: float) -> tuple[list[Tensor], list[Tensor]]:
    """One unpadded forward per sample through the model's own forward (full logits), then log_softmax."""
    log_probs, entropies = [], []
    for prompt, response in zip(batch.prompt_ids, batch.response_ids, strict=True):
        ids = torch.cat([prompt, response]).unsqueeze(0)
        logits = model(input_ids=ids, use_cache=False).logits[0].float() / temperature
        predicting = logits[prompt.numel() - 1 : prompt.numel() + response.numel() - 1]
        logp = predicting.log_softmax(-1)
        log_probs.append(logp.gather(-1, response.unsqueeze(-1)).squeeze(-1))
        entropies.append(-(logp.exp() * logp).sum(-1))
    return log_probs, entropies


def test_pack_sequences_by_hand() -> None:
    packed = pack_sequences([torch.tensor([1, 2]), torch.tensor([3])], [torch.tensor([4, 5, 6]), torch.tensor([7])])
    assert packed.input_ids.tolist() == [[1, 2, 4, 5, 6, 3, 7]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    assert packed.predictor_index.tolist() == [1, 2, 3, 5]  # the token before each response token
    assert packed.targets.tolist() == [4, 5, 6, 7]
    assert packed.response_lengths == [3, 1]
    assert packed.attention_mask is None


def test_pad_sequences_by_hand() -> None:
    padded = pad_sequences([torch.tensor([1, 2]), torch.tensor([3])], [torch.tensor([4, 5, 6]), torch.tensor([7])])
    assert padded.input_ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 0, 0, 0]]
    assert padded.attention_mask is not None
    assert padded.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert padded.position_ids.tolist() == [[0, 1, 2, 3, 4]] * 2
    # Row 0 predicts its response from columns 1, 2, 3; row 1 (flat offset 5) from column 0.
    assert padded.predictor_index.tolist() == [1, 2, 3, 5]
    assert padded.targets.tolist() == [4, 5, 6, 7]
    assert padded.response_lengths == [3, 1]


def test_auto_layout_packs_under_flash_attention_and_shares_prompts_elsewhere() -> None:
    assert resolve_layout("auto", tiny_qwen2(shape=ACTOR, attn_implementation="sdpa")) == "shared_prompt"
    assert resolve_layout("auto", tiny_qwen2(shape=ACTOR, attn_implementation="eager")) == "shared_prompt"
    model = tiny_qwen2(shape=ACTOR)
    model.config._attn_implementation = "flash_attention_2"  # what from_pretrained sets when flash-attn is chosen
    assert resolve_layout("auto", model) == "packed"
    assert resolve_layout("padded", model) == "padded"
    with pytest.raises(ValueError, match="actor.layout"):
        resolve_layout("ragged", model)


def test_shared_prompt_is_refused_with_activation_checkpointing_and_auto_falls_back_to_padded() -> None:
    model = tiny_qwen2(shape=ACTOR, attn_implementation="sdpa")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert resolve_layout("auto", model) == "padded"
    with pytest.raises(ValueError, match="shared_prompt cannot run here: activation checkpointing is on"):
        resolve_layout("shared_prompt", model)


def test_share_prompt_sequences_by_hand() -> None:
    # Samples 0 and 2 share prompt [1, 2]; sample 1 has prompt [3]. Responses of 3, 1 and 2 tokens.
    prompt_a, prompt_b = torch.tensor([1, 2]), torch.tensor([3])
    rows = share_prompt_sequences(
        [prompt_a, prompt_b, prompt_a.clone()], [torch.tensor([4, 5, 6]), torch.tensor([7]), torch.tensor([8, 9])]
    )
    assert rows.prompt_input_ids.tolist() == [[1, 2], [0, 3]]  # distinct prompts once, left-padded
    assert rows.prompt_attention_mask.tolist() == [[1, 1], [0, 1]]
    assert rows.prompt_position_ids.tolist() == [[0, 1], [0, 0]]
    assert rows.sample_prompt.tolist() == [0, 1, 0]
    # Fed lengths 2, 0, 1: sample 1 needs no response pass; 1 < 0.75 * 2 puts sample 2 in a chunk of its own.
    assert [c.samples.tolist() for c in rows.chunks] == [[0], [2]]
    first, second = rows.chunks
    assert first.input_ids.tolist() == [[4, 5]] and first.position_ids.tolist() == [[2, 3]]
    assert first.attention_mask.tolist() == [[1, 1, 1, 1]]
    assert second.input_ids.tolist() == [[8]] and second.position_ids.tolist() == [[2]]
    # Flat hidden states: [prompt a last, prompt b last, chunk 0 (2 positions), chunk 1 (1 position)].
    assert rows.predictor_index.tolist() == [0, 2, 3, 1, 0, 4]
    assert rows.targets.tolist() == [4, 5, 6, 7, 8, 9]
    assert rows.response_lengths == [3, 1, 2]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("chunk_size", [1, 7, 100_000])
@pytest.mark.parametrize(
    ("build", "attn"), [(tiny_qwen2, "sdpa"), (tiny_qwen2, "eager"), (partial(build_tiny_model, "llama3"), None)]
)
def test_log_probs_and_entropy_of_each_layout_match_per_sample_forwards(
    chunk_size: int, build: object, attn: str | None, layout: str
) -> None:
    model = build(seed=3) if attn is None else build(seed=3, attn=attn)  # type: ignore[operator]
    model.eval()
    batch = random_batch(3, 2, seed=5)
    temperature = 0.7
    with torch.no_grad():
        got, got_entropy = compute_response_log_probs(
            model, batch, temperature=temperature, chunk_size=chunk_size, with_entropy=True, layout=layout
        )
        want, want_entropy = reference(model, batch, temperature)
    assert got_entropy is not None
    for g, w, ge, we in zip(got, want, got_entropy, want_entropy, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
        torch.testing.assert_close(ge, we, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("chunk_size", [1, 7, 100_000])
def test_chunked_recomputed_gradient_matches_per_sample_gradient(chunk_size: int, layout: str) -> None:
    batch = random_batch(2, 2, seed=7)
    weights = [torch.randn(n, generator=torch.Generator().manual_seed(i)) for i, n in enumerate(batch.response_lengths)]

    def grads(use_packed: bool) -> dict[str, Tensor]:
        model = tiny_qwen2(1, ACTOR)
        model.train()
        if use_packed:
            log_probs, entropy = compute_response_log_probs(
                model, batch, temperature=1.0, chunk_size=chunk_size, with_entropy=True, layout=layout
            )
            assert entropy is not None
        else:
            log_probs, entropy = reference(model, batch, 1.0)
        objective = sum((w * lp).sum() + 0.1 * e.sum() for w, lp, e in zip(weights, log_probs, entropy, strict=True))
        objective.backward()  # type: ignore[union-attr]
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    packed, plain = grads(True), grads(False)
    assert packed.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(packed[name], plain[name], atol=1e-5, rtol=1e-4, msg=name)


def test_batch_log_probs_keep_batch_order_across_micro_batches() -> None:
    model = tiny_qwen2(2, ACTOR)
    batch = random_batch(4, 3, seed=11)
    want, _ = reference(model, batch, 1.0)
    configs = [actor_config(layout=layout, ppo_max_token_len_per_gpu=16) for layout in LAYOUTS]
    configs += [
        actor_config(layout=layout, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=5) for layout in LAYOUTS
    ]
    for cfg in configs:
        got = compute_log_probs_batch(model, batch, cfg, temperature=1.0)
        assert not any(t.requires_grad for t in got)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w.detach(), atol=1e-5, rtol=0)


def test_batch_log_probs_and_entropy_match_the_reference_in_batch_order() -> None:
    model = tiny_qwen2(3, ACTOR)
    batch = random_batch(3, 3, seed=5)
    want_lp, want_ent = reference(model, batch, 0.7)
    got_lp, got_ent = compute_log_probs_and_entropy_batch(model, batch, actor_config(ppo_max_token_len_per_gpu=20), 0.7)
    for g, w in zip(got_lp, want_lp, strict=True):
        torch.testing.assert_close(g, w.detach(), atol=1e-5, rtol=0)
    for g, w in zip(got_ent, want_ent, strict=True):
        torch.testing.assert_close(g, w.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_log_probs_warn_once_about_samples_over_the_token_budget(layout: str) -> None:
    batch = random_batch(2, 2, seed=0, max_prompt=6, max_response=8)
    # What one sample costs alone: all its tokens, or in the shared-prompt layout all but its last (never fed).
    costs = [n - (layout == "shared_prompt") for n in batch.sequence_lengths]
    budget = min(costs)  # at least one sample costs more unless all lengths are equal
    over = sum(n > budget for n in costs)
    assert over > 0
    cfg = actor_config(ppo_max_token_len_per_gpu=budget, layout=layout)
    with pytest.warns(UserWarning, match=f"{over} sample"):
        compute_log_probs_batch(tiny_qwen2(shape=ACTOR), batch, cfg, temperature=1.0)


def test_bf16_autocast_is_close_to_fp32() -> None:
    model = tiny_qwen2(4, ACTOR)
    batch = random_batch(2, 2, seed=4)
    fp32 = compute_log_probs_batch(model, batch, actor_config(dtype="fp32"), temperature=1.0)
    bf16 = compute_log_probs_batch(model, batch, actor_config(dtype="bf16"), temperature=1.0)
    assert all(t.dtype == torch.float32 for t in bf16)
    for a, b in zip(fp32, bf16, strict=True):
        torch.testing.assert_close(b, a, atol=0.1, rtol=0.05)
    assert next(model.parameters()).dtype == torch.float32  # autocast leaves the master weights alone


def test_bad_arguments_and_unsupported_models_are_refused() -> None:
    model = tiny_qwen2(shape=ACTOR)
    batch = random_batch(1, 2)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        compute_response_log_probs(model, batch, temperature=0.0, chunk_size=4, with_entropy=False)
    with pytest.raises(ValueError, match="logprob_chunk_size"):
        compute_response_log_probs(model, batch, temperature=1.0, chunk_size=0, with_entropy=False)
    too_big = TrainBatch(
        prompt_ids=[[VOCAB]],
        response_ids=[[1]],
        advantages=torch.zeros(1),
        sample_mask=torch.ones(1, dtype=torch.bool),
        group_index=torch.zeros(1, dtype=torch.long),
    )
    with pytest.raises(ValueError, match=f"token id {VOCAB} .* vocabulary of {VOCAB}"):
        compute_response_log_probs(model, too_big, temperature=1.0, chunk_size=4, with_entropy=False)
    with pytest.raises(TypeError, match="Linear is not a supported causal LM"):
        decoder_and_lm_head(nn.Linear(2, 2))
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(TypeError, match="final_logit_softcapping=30.0"):
        decoder_and_lm_head(model)
