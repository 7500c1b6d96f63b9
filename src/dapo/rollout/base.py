"""The rollout-engine interface: what the trainer asks for and what it gets back.

Every generator (the hand-written Hugging Face engine in :mod:`dapo.rollout.hf_engine`, the vLLM engine in
:mod:`dapo.rollout.vllm_engine`) implements :class:`RolloutEngine`; callers above this layer build one through
:func:`dapo.rollout.factory.build_rollout_engine` and never name a concrete class. The contract they rely on:

* **Ordering.** ``RolloutOutput`` holds one entry per sample. Prompts appear in input order and each prompt's ``n``
  samples are contiguous: entry ``i * n + j`` is sample ``j`` of prompt ``i``. DAPO's group statistics (group-mean
  advantage, dynamic sampling of all-right/all-wrong groups) read groups off this layout.
* **Termination.** A response ends with its stop token *included* (``finish_reason == "stop"``; the stop token is one of
  the engine's EOS ids or ``SamplingParams.stop_token_ids``), or after exactly ``max_tokens`` tokens
  (``finish_reason == "length"``). A response whose ``max_tokens``-th token is a stop token is "stop". Overlong reward
  shaping (DAPO Sec. 3.4) keys on "length".
* **Log-probabilities.** ``logprobs[k][t]`` is the log-probability of the sampled token ``response_ids[k][t]`` under
  the distribution it was drawn from:

      log_softmax(truncate_top_k_top_p(logits / temperature))

  vLLM's ``logprobs_mode="processed_logprobs"``. With top-k and top-p off (every DAPO training recipe: temperature
  1.0, top-p 1.0) this is log_softmax(logits / temperature) over the full vocabulary, exactly what the actor's
  teacher-forced pass computes, so ``exp(actor_logprob - rollout_logprob)`` is ~1 and any gap measures train/inference
  mismatch (kernels, precision, stale weights). With truncation on it is the behaviour policy's true probability, the
  denominator an importance weight needs. Greedy decoding (``temperature == 0``) reports temperature 1, full vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length")


def _is_int(value: object) -> bool:
    """True for a real integer (``bool`` is an ``int`` subclass in Python but never a valid count or id here)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses. Ranges are checked on construction.

    Attributes:
        n: samples per prompt (DAPO's group size G), >= 1.
        temperature: softmax temperature, >= 0; 0 means greedy decoding.
        top_p: nucleus truncation, in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; -1 or 0 disables it.
        max_tokens: response length cap L_max, >= 1.
        stop_token_ids: extra stop ids, on top of the engine's EOS ids.
        seed: seeds a private generator, so the same seed and inputs give the same output; None uses torch's global RNG.
        prompt_seeds: one seed per prompt of the call (each in [0, 2**63)), or None. An engine that honours them
            (the Hugging Face engine) draws sample ``j`` of prompt ``i`` from a random stream that depends only on
            ``prompt_seeds[i]``, ``j`` and the decode step, never on the other prompts of the call, how it is
            batched or which process runs it: the same prompt with the same seed samples the same response in any
            batch, up to float rounding of the logits in differently shaped batches. The trainer passes seeds
            derived from each prompt's position in the whole generation batch, so that data-parallel ranks, each
            generating a share, sample exactly what one process would. ``seed`` is then unused by such an engine;
            vLLM cannot seed requests on the CPU and keeps drawing from ``seed`` (see dapo.rollout.vllm_engine).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    prompt_seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"SamplingParams.n must be an integer >= 1, got {self.n!r}")
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, (int, float))
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be an integer >= 1, or -1/0 for off, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, Iterable):
            raise ValueError(f"SamplingParams.stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}")
        stop_ids = tuple(self.stop_token_ids)
        for position, token_id in enumerate(stop_ids):
            if not _is_int(token_id) or token_id < 0:
                raise ValueError(f"SamplingParams.stop_token_ids[{position}] must be an integer >= 0, got {token_id!r}")
        object.__setattr__(self, "stop_token_ids", stop_ids)
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ValueError(f"SamplingParams.seed must be None or an integer >= 0, got {self.seed!r}")
        if self.prompt_seeds is not None:
            if isinstance(self.prompt_seeds, (str, bytes)) or not isinstance(self.prompt_seeds, Iterable):
                raise ValueError(
                    f"SamplingParams.prompt_seeds must be None or a sequence of ints, got {self.prompt_seeds!r}"
                )
            seeds = tuple(self.prompt_seeds)
            for position, value in enumerate(seeds):
                if not _is_int(value) or not 0 <= value < 1 << 63:
                    raise ValueError(
                        f"SamplingParams.prompt_seeds[{position}] must be an integer in [0, 2**63), got {value!r}"
                    )
            object.__setattr__(self, "prompt_seeds", seeds)

    @property
    def greedy(self) -> bool:
        """True when decoding is deterministic argmax (temperature 0)."""
        return self.temperature == 0


@dataclass
class RolloutOutput:
    """Sampled responses, one entry per sample: prompts in input order, each prompt's ``n`` samples contiguous.

    Attributes:
        prompt_index: which input prompt each sample answers.
        response_ids: generated token ids, stop token included when ``finish_reason`` is "stop".
        logprobs: per-token log-probabilities under softmax(logits / temperature) over the full vocabulary
            (see the module docstring); same lengths as ``response_ids``.
        finish_reason: "stop" (ended on a stop token) or "length" (hit ``max_tokens``).
    """

    prompt_index: list[int]
    response_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reason: list[str]
    # Per sample, per sampled token: the weight version that drew it; set by engines that follow versioned pushes (a
    # rollout worker), None otherwise. A multi-turn trajectory lists its model tokens' only (tool tokens were not drawn).
    token_versions: list[list[int]] | None = None
    # Per sample, ``[prompt + response tokens, MoE layers, k]`` expert ids each token was routed to (-1: not recorded),
    # from an engine asked for them (R3, ``actor.router_replay.mode``); None otherwise.
    routed_experts: list[torch.Tensor] | None = None

    def __post_init__(self) -> None:
        count = len(self.prompt_index)
        if self.routed_experts is not None and len(self.routed_experts) != count:
            raise ValueError(
                f"RolloutOutput.routed_experts has {len(self.routed_experts)} entries but prompt_index has {count}"
            )
        for name in ("response_ids", "logprobs", "finish_reason"):
            if len(getattr(self, name)) != count:
                raise ValueError(
                    f"RolloutOutput.{name} has {len(getattr(self, name))} entries but prompt_index has {count}"
                )
        for k, (ids, lps, reason) in enumerate(zip(self.response_ids, self.logprobs, self.finish_reason)):
            if len(ids) != len(lps):
                raise ValueError(f"RolloutOutput sample {k}: {len(ids)} response ids but {len(lps)} logprobs")
            if reason not in FINISH_REASONS:
                raise ValueError(
                    f"RolloutOutput sample {k}: finish_reason must be one of {FINISH_REASONS}, got {reason!r}"
                )

    def __len__(self) -> int:
        return len(self.prompt_index)


@dataclass(frozen=True)
class WeightStream:
    """Named tensors that exist one at a time (a sharded actor gathers each parameter when it is asked for), with
    their names known before the first: an engine can check a push before loading anything and then copy each
    tensor in as it comes, holding at most one (or one layer's) beside its own weights, never a whole gathered state
    dict. Iterable once, in ``names`` order; a stream that yields another name than announced raises ``ValueError``.
    """

    names: tuple[str, ...]
    tensors: Iterable[tuple[str, torch.Tensor]]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        count = 0
        for count, (name, tensor) in enumerate(self.tensors, start=1):
            if count > len(self.names) or name != self.names[count - 1]:
                expected = self.names[count - 1] if count <= len(self.names) else "nothing more"
                raise ValueError(f"WeightStream: tensor {count} is {name!r}, announced as {expected!r}")
            yield name, tensor
        if count != len(self.names):
            raise ValueError(f"WeightStream: {count} tensors streamed, {len(self.names)} announced")


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates responses for token-id prompts and follows the actor's weights."""

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        """Sample ``params.n`` responses per prompt; see the module docstring for ordering and log-prob semantics."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's current weights (Hugging Face parameter names, the actor's ``named_parameters()``).

        Called by the trainer after every optimizer update. Tensors that already *are* the engine's parameters (an
        engine sharing the actor's module) are skipped; every other tensor is copied in. After it returns, the next
        ``generate`` samples from the new weights (caches that depend on the weights, e.g. a prefix cache, are reset).
        A partial push must cover whole layers (every tensor of a module, e.g. q/k/v together with their biases).
        A :class:`WeightStream` is consumed as it comes (one tensor at a time), after its names are checked.
        """
        ...

    def log_probs_of(self, prompt_token_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        """Teacher-forced log-probabilities of ``response_ids`` after ``prompt_token_ids`` under the engine's current
        weights, at temperature 1 over the full vocabulary: one float per response token.

        The trainer's weight-sync probe compares this with the actor's own forward pass after every weight push; a
        gap means the engine is sampling from other (stale) weights than the ones being trained.
        """
        ...

    def close(self) -> None:
        """Release what the engine holds (processes, device memory). Idempotent; a no-op for in-process engines."""
        ...


# One decode step of a call: (the sequences that drew a token, as entry indices of the output; their tokens; their
# log-probs) -> True to end the call after this step.
StepCallback = Callable[[list[int], list[int], list[float]], bool]


@runtime_checkable
class TokenStreamingEngine(Protocol):
    """An engine that reports each decode step while it generates (the Transformers engine): what lets a server send
    every token as it is decoded, and end a call early so that a request that arrived meanwhile joins the next one."""

    def generate_streaming(
        self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams, on_step: StepCallback
    ) -> RolloutOutput:
        """``generate``, calling ``on_step`` after every decode step with the sequences that drew a token in it (never
        one that had already stopped), in entry order. When ``on_step`` returns True the call ends after that step:
        each sequence that has not stopped answers "length" with the tokens it has, fewer than ``max_tokens``."""
        ...


@dataclass
class FinishedRequest:
    """A submitted request whose every sample has finished, with the weight versions it was sampled under.

    Attributes:
        request_id: what ``submit`` returned.
        output: the samples, laid out as ``generate`` lays them out.
        token_versions: per sample, per response token, the weight version (pushes counted by the trainer) the
            token was drawn under; one value throughout unless a partial rollout spanned a push.
    """

    request_id: int
    output: RolloutOutput
    token_versions: list[list[int]]


@runtime_checkable
class StreamingEngine(Protocol):
    """The non-blocking side of an engine: requests go in, finished ones come back as they finish, weights arrive
    tagged with a version. A blocking ``generate`` is the special case "submit, then receive until it is back"
    (:func:`dapo.rollout.stream.generate_through`); an in-process engine gets this interface from
    :class:`dapo.rollout.stream.InProcessStream`, an engine in its own process from
    :class:`dapo.rollout.worker.RemoteEngine`."""

    @property
    def weight_version(self) -> int:
        """The version of the weights the engine samples from now (0: the ones it was built with)."""
        ...

    def submit(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> int:
        """Queue a request; returns its id at once."""
        ...

    def receive(self, timeout: float | None = None) -> list[FinishedRequest]:
        """The requests that finished since the last call; waits up to ``timeout`` seconds (None: until one has)."""
        ...

    def abort(self, request_id: int) -> None:
        """Drop a queued or running request; it is never returned."""
        ...

    def push_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Load the actor's weights as ``version``; returns the transfer's metrics (bytes, seconds)."""
        ...
