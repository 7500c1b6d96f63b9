"""One contract for every rollout engine (dapo.rollout.base), run on the shipped tiny model: HF and vLLM.

Each engine starts once for the module (vLLM's start-up is 5-30 s on 2 cores); the vllm half skips, with the reason
``vllm_available()`` gives, where vLLM is not installed. The reference for every log-prob is a teacher-forced fp32
forward pass of the Hugging Face model over prompt + response.

Tolerance: 1e-4 absolute on log-probs. Both engines compute in fp32 but accumulate in another order than the
reference pass (the HF engine: KV-cached decoding; vLLM: its own CPU attention and packed GEMM kernels), which moves
log-probs by < 1e-5 here (measured max gap over ~530 tokens per case: vLLM 5.8e-6 to 8.3e-6, HF 2.5e-6 to 8.9e-6),
while a real mismatch (wrong temperature, truncation not renormalised, stale weights, another prompt's sample) moves
them by 1e-2 or more.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import dapo
from dapo.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.rollout.sampler import truncate_logits
from dapo.rollout.spec import EngineSpec
from dapo.rollout.vllm_engine import VLLMRolloutEngine, vllm_available
from tests.rollout.rollout_helpers import assert_well_formed

ASSET = Path(dapo.__file__).parent / "assets" / "tiny-qwen2"
ATOL = 1e-4
QUESTIONS = (
    "Leo collected 14 beads. He wins 9 more beads. He loses 13 beads. How many beads does Leo have in the end?",
    "Mia has 7 apples. She buys 5 more apples. How many apples does Mia have now?",
    "A shelf holds 18 books. 6 books are taken away. How many books are left on the shelf?",
)

pytestmark = pytest.mark.skipif(not (ASSET / "model.safetensors").exists(), reason="tiny model not built yet")


def task_prompt(question: str) -> str:
    return (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
        f'{question}\n\nRemember to put your answer on its own line after "Answer:".'
    )


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(ASSET, local_files_only=True)


@pytest.fixture(scope="module")
def prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Chat-formatted task prompts: the tiny model answers them in ~20-30 tokens and then emits EOS."""
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": task_prompt(q)}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def eos(tokenizer: PreTrainedTokenizerBase) -> int:
    return int(tokenizer.eos_token_id)


@pytest.fixture(scope="module")
def hf_model() -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(ASSET, local_files_only=True, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["hf", "vllm"])
def engine(
    request: pytest.FixtureRequest, hf_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, eos: int
) -> Iterator[RolloutEngine]:
    if request.param == "hf":
        built: RolloutEngine = HFRolloutEngine(hf_model, eos_token_ids=eos, pad_token_id=int(tokenizer.pad_token_id))
    else:
        ok, reason = vllm_available()
        if not ok:
            pytest.skip(reason)
        built = VLLMRolloutEngine(
            ASSET, EngineSpec(name="vllm", dtype="float32", seed=0, max_model_len=256), eos_token_ids=eos
        )
    yield built
    built.close()


def reference_logprobs(
    model: PreTrainedModel,
    prompt: list[int],
    response: list[int],
    *,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
) -> torch.Tensor:
    """log_softmax(truncate(logits / T)) of each response token, from one fp32 teacher-forced forward pass."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    logits = truncate_logits(logits, top_k=top_k, top_p=top_p)
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def max_gap(output: RolloutOutput, model: PreTrainedModel, prompts: list[list[int]], **truncation: float) -> float:
    gap = 0.0
    for k in range(len(output)):
        expected = reference_logprobs(model, prompts[output.prompt_index[k]], output.response_ids[k], **truncation)
        assert torch.isfinite(expected).all(), f"sample {k} has a token outside the truncated set"
        gap = max(gap, (torch.tensor(output.logprobs[k]) - expected).abs().max().item())
    return gap


# ------------------------------------------------------------------------------------------------ (1) log-probs
@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, -1), (0.7, 1.0, -1), (1.0, 0.7, -1), (0.8, 0.9, 5), (0.0, 1.0, -1)],
    ids=["T1", "T0.7", "top_p0.7", "T0.8-top_p0.9-top_k5", "greedy"],
)
def test_logprobs_are_those_of_the_sampling_distribution(
    engine: RolloutEngine,
    hf_model: PreTrainedModel,
    prompts: list[list[int]],
    eos: int,
    temperature: float,
    top_p: float,
    top_k: int,
) -> None:
    params = SamplingParams(n=2, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=12, seed=3)
    output = engine.generate(prompts, params)
    assert_well_formed(output, len(prompts), params, {eos})
    # Greedy reports temperature 1 over the full vocabulary; otherwise the (truncated) distribution sampled from.
    truncation = {"temperature": 1.0} if params.greedy else {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    assert max_gap(output, hf_model, prompts, **truncation) <= ATOL


def test_greedy_follows_the_argmax(engine: RolloutEngine, hf_model: PreTrainedModel, prompts: list[list[int]]) -> None:
    output = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=10))
    for k, ids in enumerate(output.response_ids):
        sequence = prompts[k] + ids
        with torch.no_grad():
            logits = hf_model(torch.tensor([sequence])).logits[0, len(prompts[k]) - 1 : -1]
        assert logits.argmax(dim=-1).tolist() == ids


# ------------------------------------------------------------------------------------------------ (2) layout
def test_n_samples_per_prompt_are_contiguous(
    engine: RolloutEngine, hf_model: PreTrainedModel, prompts: list[list[int]], eos: int
) -> None:
    params = SamplingParams(n=3, max_tokens=8, seed=11)
    output = engine.generate(prompts, params)
    assert output.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert_well_formed(output, len(prompts), params, {eos})
    # Each sample answers the prompt it is filed under: its log-probs are those of a pass over *that* prompt.
    assert max_gap(output, hf_model, prompts) <= ATOL
    assert len({tuple(ids) for ids in output.response_ids}) > 3, "samples should not all repeat per prompt"


def test_greedy_with_n_gives_n_equal_samples(engine: RolloutEngine, prompts: list[list[int]]) -> None:
    output = engine.generate(prompts[:2], SamplingParams(n=3, temperature=0.0, max_tokens=6))
    assert output.prompt_index == [0, 0, 0, 1, 1, 1]
    for prompt in range(2):
        group = output.response_ids[prompt * 3 : (prompt + 1) * 3]
        assert group[0] == group[1] == group[2]


# ------------------------------------------------------------------------------------------------ (3)/(4) termination
def test_eos_ends_the_response_and_is_kept(engine: RolloutEngine, prompts: list[list[int]], eos: int) -> None:
    output = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64))
    assert output.finish_reason == ["stop"] * len(prompts)
    for ids in output.response_ids:
        assert ids[-1] == eos and eos not in ids[:-1] and len(ids) > 5


def test_extra_stop_token_ids_cut_at_their_first_occurrence(
    engine: RolloutEngine, prompts: list[list[int]], eos: int
) -> None:
    free = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=64))
    stop_token = free.response_ids[0][2]
    params = SamplingParams(temperature=0.0, max_tokens=64, stop_token_ids=(stop_token,))
    stopped = engine.generate(prompts, params)
    assert_well_formed(stopped, len(prompts), params, {eos, stop_token})
    for full, cut, reason in zip(free.response_ids, stopped.response_ids, stopped.finish_reason):
        end = full.index(stop_token) + 1 if stop_token in full else len(full)
        assert cut == full[:end] and reason == "stop"
    assert len(stopped.response_ids[0]) <= 3


def test_max_tokens_gives_length_with_exactly_max_tokens(
    engine: RolloutEngine, prompts: list[list[int]], eos: int
) -> None:
    params = SamplingParams(n=2, max_tokens=4, seed=5)
    output = engine.generate(prompts, params)
    assert output.finish_reason == ["length"] * len(output)
    assert all(len(ids) == 4 and eos not in ids for ids in output.response_ids)


def test_a_stop_token_at_the_last_allowed_position_counts_as_stop(
    engine: RolloutEngine, prompts: list[list[int]], eos: int
) -> None:
    full = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=64)).response_ids[0]
    exact = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=len(full)))
    assert exact.response_ids == [full] and exact.finish_reason == ["stop"]
    short = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=len(full) - 1))
    assert short.response_ids == [full[:-1]] and short.finish_reason == ["length"]


# ------------------------------------------------------------------------------------------------ (5) seeds
def test_same_seed_reproduces_and_other_seeds_differ(engine: RolloutEngine, prompts: list[list[int]]) -> None:
    params = SamplingParams(n=4, max_tokens=12, seed=7)
    rng_before = torch.get_rng_state()
    first = engine.generate(prompts, params)
    assert torch.equal(torch.get_rng_state(), rng_before), "a seeded generate must leave the global RNG alone"
    # Unseeded sampling and a weight-sync probe in between (what a training step does) change nothing.
    engine.generate(prompts, SamplingParams(n=2, max_tokens=6))
    engine.log_probs_of(prompts[0], first.response_ids[0])
    again = engine.generate(prompts, params)
    other = engine.generate(prompts, SamplingParams(n=4, max_tokens=12, seed=8))
    assert again == first
    assert other.response_ids != first.response_ids


# ------------------------------------------------------------------------------------------------ (6) weights
def perturbed(model: PreTrainedModel, scale: float, seed: int, only: str | None = None) -> PreTrainedModel:
    """A copy of ``model`` with Gaussian noise added to its parameters (or just to ``only``); ties are kept."""
    copy_ = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in copy_.named_parameters():
            if only is None or name == only:
                param.add_(torch.randn(param.shape, generator=generator) * scale)
    return copy_


def test_update_weights_changes_the_policy_and_restoring_brings_it_back(
    engine: RolloutEngine, hf_model: PreTrainedModel, prompts: list[list[int]]
) -> None:
    # The HF engine shares hf_model, so a push overwrites it: keep the original weights and reference aside.
    original = [(name, param.detach().clone()) for name, param in hf_model.named_parameters()]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    before = engine.generate(prompts, greedy)
    response = before.response_ids[0]
    unperturbed = reference_logprobs(hf_model, prompts[0], response)
    other = perturbed(hf_model, scale=0.05, seed=0)
    try:
        engine.update_weights(other.named_parameters())
        changed = engine.generate(prompts, greedy)
        assert changed.response_ids != before.response_ids
        probe = torch.tensor(engine.log_probs_of(prompts[0], response))
        torch.testing.assert_close(probe, reference_logprobs(other, prompts[0], response), atol=ATOL, rtol=0)
        assert (probe - unperturbed).abs().max() > 1e-2
        assert max_gap(changed, other, prompts) <= ATOL  # the greedy log-probs come from the pushed weights too
    finally:
        engine.update_weights(original)
    restored = engine.generate(prompts, greedy)
    assert restored.response_ids == before.response_ids
    torch.testing.assert_close(
        torch.tensor(sum(restored.logprobs, [])), torch.tensor(sum(before.logprobs, [])), atol=ATOL, rtol=0
    )


def test_tied_embedding_update_reaches_the_output_layer(
    engine: RolloutEngine, hf_model: PreTrainedModel, prompts: list[list[int]]
) -> None:
    assert hf_model.config.tie_word_embeddings, "this test is about the tiny model's tied embeddings"
    name = "model.embed_tokens.weight"
    original = hf_model.get_parameter(name).detach().clone()
    other = perturbed(hf_model, scale=0.05, seed=1, only=name)
    response = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=12)).response_ids[0]
    try:
        engine.update_weights([(name, other.get_parameter(name))])  # a partial update: one tensor
        probe = torch.tensor(engine.log_probs_of(prompts[0], response))
        torch.testing.assert_close(probe, reference_logprobs(other, prompts[0], response), atol=ATOL, rtol=0)
    finally:
        engine.update_weights([(name, original)])
    probe = torch.tensor(engine.log_probs_of(prompts[0], response))
    torch.testing.assert_close(probe, reference_logprobs(hf_model, prompts[0], response), atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------ (7) probe
def test_log_probs_of_is_a_teacher_forced_pass(
    engine: RolloutEngine, hf_model: PreTrainedModel, prompts: list[list[int]]
) -> None:
    sampled = engine.generate(prompts[1:2], SamplingParams(max_tokens=10, seed=2)).response_ids[0]
    arbitrary = [17, 250, 3, 3, 599, 42]  # any ids, likely or not
    for response in (sampled, arbitrary):
        probe = engine.log_probs_of(prompts[1], response)
        assert len(probe) == len(response)
        torch.testing.assert_close(
            torch.tensor(probe), reference_logprobs(hf_model, prompts[1], response), atol=ATOL, rtol=0
        )
    assert engine.log_probs_of(prompts[1], []) == []
