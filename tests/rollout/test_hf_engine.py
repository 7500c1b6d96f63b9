"""HFRolloutEngine on tiny random Qwen2 models: log-probs, padding, stopping, seeding, layout, shrinking, weights."""

from __future__ import annotations

import pytest
import torch

from dapo.rollout import HFRolloutEngine, SamplingParams
from tests.harness.models import tiny_qwen2

from .rollout_helpers import EOS, PAD, VOCAB, assert_well_formed, teacher_forced_logprobs

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [3], [20, 21, 22, 23]]


def eos_prone_model(seed: int = 0) -> torch.nn.Module:
    """A tiny model whose EOS logit is amplified, so that some responses stop early and others run to max_tokens."""
    model = tiny_qwen2(seed)
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 2.0
    return model


def engine_for(model: torch.nn.Module, **kwargs: object) -> HFRolloutEngine:
    return HFRolloutEngine(model, eos_token_ids=EOS, pad_token_id=PAD, **kwargs)


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, -1), (0.7, 1.0, -1), (1.0, 0.7, -1), (0.8, 0.9, 5), (0.0, 1.0, -1)],
)
def test_logprobs_equal_a_teacher_forced_pass(temperature: float, top_p: float, top_k: int) -> None:
    model = eos_prone_model()
    params = SamplingParams(n=3, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=12, seed=3)
    output = engine_for(model).generate(PROMPTS, params)
    assert_well_formed(output, len(PROMPTS), params, {EOS}, vocab_size=VOCAB)
    greedy = temperature == 0  # greedy reports temperature 1 over the full vocabulary
    for k in range(len(output)):
        expected = teacher_forced_logprobs(
            model,
            PROMPTS[output.prompt_index[k]],
            output.response_ids[k],
            1.0 if greedy else temperature,
            top_k=-1 if greedy else top_k,
            top_p=1.0 if greedy else top_p,
        )
        torch.testing.assert_close(torch.tensor(output.logprobs[k]), expected, atol=1e-4, rtol=0)


def test_left_padding_does_not_change_greedy_output(tiny_model: torch.nn.Module) -> None:
    engine = engine_for(tiny_model)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    short = [3, 4]
    alone = engine.generate([short], params)
    batched = engine.generate([list(range(2, 14)), short, [30, 31, 32, 33, 34]], params)
    assert batched.response_ids[1] == alone.response_ids[0]
    torch.testing.assert_close(torch.tensor(batched.logprobs[1]), torch.tensor(alone.logprobs[0]), atol=1e-5, rtol=0)


def test_each_sequence_stops_at_its_own_stop_token() -> None:
    params = SamplingParams(n=4, max_tokens=16, seed=0)
    output = engine_for(eos_prone_model()).generate(PROMPTS, params)
    assert_well_formed(output, len(PROMPTS), params, {EOS}, vocab_size=VOCAB)
    assert "stop" in output.finish_reason and "length" in output.finish_reason
    stopped_lengths = {len(ids) for ids, r in zip(output.response_ids, output.finish_reason) if r == "stop"}
    assert len(stopped_lengths) > 1, "sequences should stop at different steps"


def test_request_stop_token_ids_add_to_the_eos_ids(tiny_model: torch.nn.Module) -> None:
    engine = engine_for(tiny_model)
    free = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=8))
    # Stop on the 3rd greedy token of prompt 0: its response must be cut right there.
    stop_token = free.response_ids[0][2]
    params = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=(stop_token,))
    stopped = engine.generate(PROMPTS, params)
    assert_well_formed(stopped, len(PROMPTS), params, {EOS, stop_token}, vocab_size=VOCAB)
    first = free.response_ids[0].index(stop_token)
    assert stopped.response_ids[0] == free.response_ids[0][: first + 1]
    assert stopped.finish_reason[0] == "stop"


def test_stop_token_at_the_last_allowed_position_counts_as_stop(tiny_model: torch.nn.Module) -> None:
    engine = engine_for(tiny_model)
    free = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6))
    last = free.response_ids[0][-1]
    if last in free.response_ids[0][:-1]:
        pytest.skip("greedy continuation repeats its last token earlier; pick another prompt")
    output = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(last,)))
    assert output.response_ids[0] == free.response_ids[0] and output.finish_reason == ["stop"]


def test_same_seed_same_output_different_seed_different_output() -> None:
    engine = engine_for(eos_prone_model())
    first = engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=10, seed=7))
    second = engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=10, seed=7))
    other = engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=10, seed=8))
    assert first == second
    assert first.response_ids != other.response_ids


def test_prompt_seeds_make_each_prompts_samples_independent_of_the_batch() -> None:
    # The data-parallel guarantee: a prompt with its seed samples the same responses alone, in another order, in a
    # batch with other prompts (other padding width) or in max_batch_size chunks; only float rounding of logits in
    # differently shaped batches could flip a draw, and on these prompts none does.
    engine = engine_for(eos_prone_model())
    params = SamplingParams(n=3, max_tokens=10, top_p=0.9, prompt_seeds=(11, 12, 13, 14))
    whole = engine.generate(PROMPTS, params)
    for i, prompt in enumerate(PROMPTS):
        alone = engine.generate([prompt], SamplingParams(n=3, max_tokens=10, top_p=0.9, prompt_seeds=(11 + i,)))
        assert alone.response_ids == whole.response_ids[i * 3 : (i + 1) * 3]
        assert alone.finish_reason == whole.finish_reason[i * 3 : (i + 1) * 3]
        for a, b in zip(alone.logprobs, whole.logprobs[i * 3 : (i + 1) * 3]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    order = [2, 0, 3, 1]
    shuffled = engine.generate(
        [PROMPTS[i] for i in order],
        SamplingParams(n=3, max_tokens=10, top_p=0.9, prompt_seeds=tuple(11 + i for i in order)),
    )
    assert [
        ids for k in range(4) for ids in shuffled.response_ids[order.index(k) * 3 : order.index(k) * 3 + 3]
    ] == whole.response_ids
    chunked = HFRolloutEngine(engine.model, eos_token_ids=EOS, pad_token_id=PAD, max_batch_size=5).generate(
        PROMPTS, params
    )
    assert chunked.response_ids == whole.response_ids
    # the samples of one prompt differ from each other, and another seed gives other samples
    assert len({tuple(ids) for ids in whole.response_ids[:3]}) > 1
    other = engine.generate(PROMPTS, SamplingParams(n=3, max_tokens=10, top_p=0.9, prompt_seeds=(21, 12, 13, 14)))
    assert other.response_ids[:3] != whole.response_ids[:3] and other.response_ids[3:] == whole.response_ids[3:]
    # the call seed plays no part once prompt seeds are given
    assert (
        engine.generate(PROMPTS, SamplingParams(n=3, max_tokens=10, top_p=0.9, seed=5, prompt_seeds=(11, 12, 13, 14)))
        == whole
    )
    with pytest.raises(ValueError, match="3 prompt_seeds for 4 prompts"):
        engine.generate(PROMPTS, SamplingParams(prompt_seeds=(1, 2, 3)))


def test_n_samples_are_contiguous_per_prompt_and_differ() -> None:
    params = SamplingParams(n=5, max_tokens=8, seed=1)
    output = engine_for(tiny_qwen2(0)).generate(PROMPTS, params)
    assert output.prompt_index == [0] * 5 + [1] * 5 + [2] * 5 + [3] * 5
    for prompt in range(len(PROMPTS)):
        group = output.response_ids[prompt * 5 : (prompt + 1) * 5]
        assert len({tuple(ids) for ids in group}) > 1, f"prompt {prompt}: the 5 samples should not all be identical"


def test_top_k_one_and_tiny_top_p_equal_greedy() -> None:
    engine = engine_for(eos_prone_model())
    greedy = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.0, max_tokens=10))
    top_k_1 = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.9, top_k=1, max_tokens=10, seed=4))
    tiny_p = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.9, top_p=1e-6, max_tokens=10, seed=4))
    assert top_k_1.response_ids == greedy.response_ids == tiny_p.response_ids
    assert top_k_1.finish_reason == greedy.finish_reason
    # Same tokens; sampled from a one-token distribution, each has probability 1 (the greedy's are at temperature 1).
    assert all(lp == 0.0 for lps in top_k_1.logprobs + tiny_p.logprobs for lp in lps)
    assert any(lp < 0.0 for lps in greedy.logprobs for lp in lps)


def test_finished_rows_are_dropped_from_the_batch(row_counter) -> None:
    model = eos_prone_model()
    params = SamplingParams(n=4, temperature=0.0, max_tokens=16)
    shrinking = engine_for(model)
    counter = row_counter(model)
    output = shrinking.generate(PROMPTS, params)
    prefill, decode = counter.calls[0], counter.calls[1:]
    assert prefill == (len(PROMPTS), max(map(len, PROMPTS))), "each distinct prompt is prefilled once"
    assert all(length == 1 for _, length in decode)
    lengths = [len(ids) for ids in output.response_ids]
    # Row k needs one decode step per token after its first. The batch holds the rows still running plus, until they
    # are an eighth of it, the rows that have finished; it ends when the last row stops.
    running = [sum(1 for n in lengths if n > step) for step in range(1, max(lengths))]
    batch = [rows for rows, _ in decode]
    assert len(batch) == len(running)
    assert all(rows >= live and (rows - live) * 8 < rows for rows, live in zip(batch, running))
    assert batch[-1] < batch[0]  # the batch did shrink

    counter.calls.clear()
    full = engine_for(model, drop_finished=False).generate(PROMPTS, params)
    assert full.response_ids == output.response_ids and full.finish_reason == output.finish_reason
    for kept, shrunk in zip(full.logprobs, output.logprobs):  # equal up to batch-shape float noise
        torch.testing.assert_close(torch.tensor(kept), torch.tensor(shrunk), atol=1e-5, rtol=0)
    full_batch_rows = sum(rows for rows, _ in counter.calls[1:])
    assert full_batch_rows == len(lengths) * (max(lengths) - 1)
    assert sum(length - 1 for length in lengths) < full_batch_rows


def test_max_batch_size_chunks_without_changing_greedy_output(row_counter) -> None:
    model = eos_prone_model()
    params = SamplingParams(n=3, temperature=0.0, max_tokens=8)
    whole = engine_for(model).generate(PROMPTS, params)
    counter = row_counter(model)
    chunked = engine_for(model, max_batch_size=5).generate(PROMPTS, params)
    assert max(rows for rows, _ in counter.calls) <= 5
    assert chunked.response_ids == whole.response_ids and chunked.finish_reason == whole.finish_reason
    assert chunked.prompt_index == whole.prompt_index
    torch.testing.assert_close(
        torch.tensor([lp for lps in chunked.logprobs for lp in lps]),
        torch.tensor([lp for lps in whole.logprobs for lp in lps]),
        atol=1e-5,
        rtol=0,
    )


def test_runs_in_eval_mode_and_restores_the_training_flag() -> None:
    model = tiny_qwen2(0, attention_dropout=0.5)
    model.train()
    output = engine_for(model).generate(PROMPTS[:2], SamplingParams(n=2, max_tokens=6, seed=0))
    assert model.training and all(m.training for m in model.modules())
    for k in range(len(output)):  # matches the dropout-free (eval) teacher-forced pass
        expected = teacher_forced_logprobs(model, PROMPTS[output.prompt_index[k]], output.response_ids[k], 1.0)
        torch.testing.assert_close(torch.tensor(output.logprobs[k]), expected, atol=1e-4, rtol=0)
    model.eval()
    engine_for(model).generate(PROMPTS[:1], SamplingParams(max_tokens=2, seed=0))
    assert not model.training


def test_update_weights_is_a_no_op_for_shared_tensors_and_copies_others() -> None:
    model, other = tiny_qwen2(0), tiny_qwen2(1)
    engine = engine_for(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    engine.update_weights(model.named_parameters())
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())

    params = SamplingParams(temperature=0.0, max_tokens=6)
    engine.update_weights(other.state_dict().items())
    assert engine.generate(PROMPTS, params) == engine_for(other).generate(PROMPTS, params)
    with pytest.raises(KeyError, match="no parameter or buffer 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))])
    with pytest.raises(ValueError, match="'lm_head.weight' has shape"):
        engine.update_weights([("lm_head.weight", torch.zeros(2, 2))])


def test_empty_request_gives_empty_output(tiny_model: torch.nn.Module) -> None:
    output = engine_for(tiny_model).generate([], SamplingParams(n=3))
    assert len(output) == 0 and output.response_ids == []


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ([[1, 2], []], "prompt 1 must be a non-empty"),
        ([[1, VOCAB]], f"prompt 0 has token id {VOCAB} outside the vocabulary"),
        ([[-1, 2]], "prompt 0 has token id -1"),
        ([[1.0, 2.0]], "prompt 0 has non-integer token ids"),
        ([[[1, 2]]], "prompt 0 must be a non-empty 1-D"),
    ],
)
def test_bad_prompts_are_rejected(tiny_model: torch.nn.Module, prompts: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine_for(tiny_model).generate(prompts, SamplingParams(max_tokens=2))


def test_bad_constructor_arguments_are_rejected(tiny_model: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="pad_token_id"):
        HFRolloutEngine(tiny_model, eos_token_ids=EOS, pad_token_id=VOCAB)
    with pytest.raises(ValueError, match="eos_token_ids"):
        HFRolloutEngine(tiny_model, eos_token_ids=[-3], pad_token_id=PAD)
    with pytest.raises(ValueError, match="max_batch_size"):
        HFRolloutEngine(tiny_model, eos_token_ids=EOS, pad_token_id=PAD, max_batch_size=0)
    with pytest.raises(ValueError, match="differs from the model's device"):
        HFRolloutEngine(tiny_model, eos_token_ids=EOS, pad_token_id=PAD, device="meta")
    engine = HFRolloutEngine(tiny_model, eos_token_ids=EOS, pad_token_id=PAD)
    with pytest.raises(TypeError, match="SamplingParams"):
        engine.generate([[1]], {"n": 1})  # type: ignore[arg-type]


def test_greedy_output_matches_transformers_generate() -> None:
    model = eos_prone_model()
    output = engine_for(model).generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12))
    width = max(map(len, PROMPTS))
    input_ids = torch.tensor([[PAD] * (width - len(p)) + p for p in PROMPTS])
    attention_mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in PROMPTS]).unsqueeze(-1)).long()
    sequences = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=False,
        max_new_tokens=12,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    for k, ids in enumerate(output.response_ids):
        reference = sequences[k, width:].tolist()
        assert ids == reference[: len(ids)]
        assert all(t == PAD for t in reference[len(ids) :]), "generate kept going where the engine stopped"


# ------------------------------------------------------------------------------------------------ streaming steps
def _record_steps(cut_after: int | None = None):
    """An on_step that records every (entry, token, logprob) per step, ending the call after ``cut_after`` steps."""
    steps: list[list[tuple[int, int, float]]] = []

    def on_step(rows: list[int], tokens: list[int], logprobs: list[float]) -> bool:
        steps.append(list(zip(rows, tokens, logprobs)))
        return cut_after is not None and len(steps) >= cut_after

    return steps, on_step


@pytest.mark.parametrize("max_batch_size", [None, 5])
def test_every_step_reports_each_running_rows_token_and_nothing_past_its_stop(max_batch_size) -> None:
    # The stream a server builds from the steps must be the output itself: same tokens, same log-probs, in order, and
    # no token a row drew after its stop token while it waited to leave the batch.
    params = SamplingParams(n=3, max_tokens=16, seed=0)
    engine = engine_for(eos_prone_model(), max_batch_size=max_batch_size)
    steps, on_step = _record_steps()
    output = engine.generate_streaming(PROMPTS, params, on_step)
    assert output.response_ids == engine.generate(PROMPTS, params).response_ids  # reporting changes nothing drawn
    assert "stop" in output.finish_reason and "length" in output.finish_reason
    streamed: dict[int, list[tuple[int, float]]] = {k: [] for k in range(len(output))}
    for step in steps:
        assert [k for k, _, _ in step] == sorted(k for k, _, _ in step)  # entry order
        for k, token, logprob in step:
            streamed[k].append((token, logprob))
    for k in range(len(output)):
        assert [t for t, _ in streamed[k]] == output.response_ids[k]
        assert [lp for _, lp in streamed[k]] == pytest.approx(output.logprobs[k], abs=1e-6)


def test_a_step_callback_can_end_the_call_early() -> None:
    params = SamplingParams(n=2, temperature=0.0, max_tokens=12)
    engine = engine_for(tiny_qwen2(0), max_batch_size=4)  # 8 rows: the second chunk never starts
    full = engine.generate(PROMPTS, params)
    steps, on_step = _record_steps(cut_after=3)
    cut = engine.generate_streaming(PROMPTS, params, on_step)
    assert len(steps) == 3
    for k in range(len(cut)):
        if k < 4:
            assert cut.response_ids[k] == full.response_ids[k][:3]
            assert cut.finish_reason[k] == (
                "stop" if full.finish_reason[k] == "stop" and len(full.response_ids[k]) <= 3 else "length"
            )
        else:
            assert cut.response_ids[k] == [] and cut.finish_reason[k] == "length"
