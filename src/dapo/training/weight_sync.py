"""After every optimizer update the actor's weights go into the rollout engine, and a probe checks they arrived.

The probe: the log-probs of one fixed sequence under the engine (``RolloutEngine.log_probs_of``) and under the actor
(a plain fp32 forward pass). A correct push leaves only numerical noise between the two (kernels, precision: ~1e-7 for
the Transformers engine sharing the module, more for vLLM or bf16); an engine that keeps sampling from old weights
shows the whole effect of the update. The first push of a run (engine and actor holding the same weights) measures the
numerical gap alone, and later pushes are judged by their excess over it. An engine in a lower precision than the
actor (``engine_dtype``: a bf16 engine, an fp32 actor) is judged otherwise, because its gap is not steady: it grows as
training sharpens the model (SmolLM2 in bf16: 0.044 at the start, 0.1 within 8 steps, 0.2 after 30, with the copy's
weights exactly the actor's in bf16), so any fixed bound either misses stale weights or stops healthy runs. Each
push must instead move the engine's probe log-probs (against those after the previous push) at least half as far as
the update moved the actor's; a stale engine does not move at all. Colocated engines that silently keep stale weights
are a known failure of RL systems, and they train on off-policy samples without any error, so a failed probe stops
the run.

A sharded actor (FSDP2) pushes into an engine holding its own unsharded copy: every rank gathers each parameter in
turn (``stream_full_parameters``) and the engine copies it in; the probe's actor side runs through the sharded root,
the same sequence on every rank, so its collectives match.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo.distributed.data_parallel import is_sharded
from dapo.distributed.fsdp import stream_full_parameters
from dapo.model.lora import is_lora
from dapo.rollout.base import RolloutEngine, WeightStream
from dapo.training.errors import TrainingError

PROBE_LENGTH = 32
# A low-precision engine's first probe, same weights on both sides, must be within this mean gap: bf16 measured
# 0.02-0.05 on the tiny model and SmolLM2 at the start, 0.2 on SmolLM2 after 30 steps; another model is nats away.
LOW_PRECISION_FIRST_GAP = 0.5
# The actor must have moved by at least threshold x this for the movement check to judge a push (an update too small
# to see in the probe cannot show whether it arrived).
MOVEMENT_FLOOR = 0.01


def probe_halves(probe_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """The probe's prompt and response: the first ``2 * PROBE_LENGTH`` tokens of ``probe_ids``, halved."""
    ids = list(probe_ids)[: 2 * PROBE_LENGTH]
    if len(ids) < 2:
        raise ValueError("WeightSync: the probe sequence needs at least 2 tokens")
    half = len(ids) // 2
    return ids[:half], ids[half:]


def actor_log_probs_of(
    model: torch.nn.Module, prompt: Sequence[int], response: Sequence[int], *, compute_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Teacher-forced log-probs of ``response`` after ``prompt`` under ``model`` at temperature 1, returned in fp32;
    with ``compute_dtype`` (bf16, fp16) the forward runs under autocast to it, the precision a low-precision engine
    computes in."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(response)], device=device)
    was_training = model.training
    model.eval()
    low_precision = compute_dtype is not None and compute_dtype != torch.float32
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=compute_dtype, enabled=low_precision):
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    finally:
        model.train(was_training)
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response, device=device).unsqueeze(-1))[:, 0].cpu()


def sharded_push(model: torch.nn.Module) -> WeightStream:
    """What a sharded actor pushes, each tensor gathered in turn: every parameter, or for a LoRA actor only the
    adapters (as a replicated LoRA actor pushes them: the frozen base weights are the engine's since it loaded)."""
    trainable_only = is_lora(model.hf_model)
    names = tuple(name for name, p in model.named_parameters() if p.requires_grad or not trainable_only)
    return WeightStream(names, stream_full_parameters(model, trainable_only=trainable_only))


class WeightSync:
    """Pushes the actor's weights into the engine and, optionally, probes the engine with one fixed sequence.

    Args:
        engine: the rollout engine.
        model: the actor's module (its ``named_parameters()`` are pushed).
        probe_ids: token ids of the probe sequence; the first half is the prompt, the rest the scored response.
        threshold: largest mean |engine - actor| log-prob gap accepted; None logs the gap without stopping.
        enabled: False pushes without probing.
        engine_dtype: the dtype the engine computes in, when lower than the actor's: the actor side of the probe then
            runs under autocast to it, and pushes are judged by the movement check (module docstring). Measured on
            SmolLM2 after 30 fp32 training steps, a bf16 engine (an exact bf16 copy of the weights) is 0.199 off the
            fp32 actor and 0.061 off the actor under bf16 autocast (0.044 and 0.043 before training).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        model: torch.nn.Module,
        probe_ids: Sequence[int],
        *,
        threshold: float | None,
        enabled: bool = True,
        engine_dtype: torch.dtype | None = None,
    ) -> None:
        self.engine, self.model = engine, model
        self.prompt, self.response = probe_halves(probe_ids)
        self.threshold, self.enabled, self.engine_dtype = threshold, enabled, engine_dtype
        # The gap of the first push, when engine and actor hold the same weights: numerics alone (~1e-7 for an fp32
        # engine, ~0.02-0.04 for a bf16 one against an fp32 actor). Later pushes are judged by their excess over it.
        self.numerical_gap: float | None = None
        # Both sides of the last probe: the engine's weights do not change between pushes, so its log-probs after the
        # last push are its log-probs before this one.
        self.previous_actor_lp: torch.Tensor | None = None
        self.previous_engine_lp: torch.Tensor | None = None

    def push(self, step: int) -> dict[str, float]:
        """Push the weights; return the probe's metrics. Raises ``TrainingError`` when the engine is stale."""
        # A sharded actor streams its parameters one gathered tensor at a time, never a whole gathered state dict.
        if is_sharded(self.model):
            weights = sharded_push(self.model)
        elif is_lora(self.model):  # frozen base weights never change: the engine has them since it loaded
            weights = ((name, p) for name, p in self.model.named_parameters() if p.requires_grad)
        else:
            weights = self.model.named_parameters()
        # An engine in its own process takes the push tagged with the step its weights belong to (the samples it
        # draws carry that version) and reports the transfer.
        push_weights = getattr(self.engine, "push_weights", None)
        if push_weights is not None:
            transfer = push_weights(weights, version=step)
        else:
            self.engine.update_weights(weights)
            transfer = {}
        if not self.enabled:
            return transfer
        engine_lp = torch.tensor(self.engine.log_probs_of(self.prompt, self.response), dtype=torch.float32)
        actor_lp = actor_log_probs_of(self.model, self.prompt, self.response, compute_dtype=self.engine_dtype)
        gap = (engine_lp - actor_lp).abs()
        mean_gap, max_gap = float(gap.mean()), float(gap.max())
        if not (bool(torch.isfinite(engine_lp).all()) and bool(torch.isfinite(actor_lp).all())):
            side = "actor's" if not bool(torch.isfinite(actor_lp).all()) else "rollout engine's"
            raise TrainingError(
                f"step {step}: after the weight push the {side} log-probs on the probe sequence are non-finite: the "
                "weights hold NaN/inf or overflow the logits (a learning rate too high for the model is the usual "
                "cause; lower actor.optim.lr). The last complete checkpoint is untouched"
            )
        metrics = {**transfer, "rollout/probe_logprob_diff": mean_gap, "rollout/probe_logprob_diff_max": max_gap}
        first = self.numerical_gap is None
        if first:
            self.numerical_gap = mean_gap
        previous_actor_lp, self.previous_actor_lp = self.previous_actor_lp, actor_lp
        previous_engine_lp, self.previous_engine_lp = self.previous_engine_lp, engine_lp
        if self.threshold is None:
            return metrics
        if self.engine_dtype is not None:
            self._check_low_precision(
                step, mean_gap, actor_lp, previous_actor_lp, engine_lp, previous_engine_lp, metrics
            )
            return metrics
        excess = mean_gap if first else mean_gap - self.numerical_gap
        if not excess <= self.threshold:
            if first:
                raise TrainingError(
                    f"step {step}: right after loading the actor's weights the rollout engine's log-probs differ from "
                    f"the actor's by {mean_gap:.4g} on average (max {max_gap:.4g}) on the probe sequence, more than "
                    f"rollout.probe_logprob_threshold={self.threshold}: the engine does not compute what the actor "
                    "computes (another model, broken weights, or a low precision; raise the threshold if the gap is "
                    "only numerical)"
                )
            raise TrainingError(
                f"step {step}: after the weight push the rollout engine's log-probs differ from the actor's by "
                f"{mean_gap:.4g} on average (max {max_gap:.4g}) on the probe sequence, {excess:.4g} more than the "
                f"{self.numerical_gap:.4g} of the run's first push (same weights: numerics alone), above "
                f"rollout.probe_logprob_threshold={self.threshold}. The engine is most likely generating from stale "
                "weights (the update did not reach it)"
            )
        return metrics

    def _check_low_precision(
        self,
        step: int,
        mean_gap: float,
        actor_lp: torch.Tensor,
        previous_actor_lp: torch.Tensor | None,
        engine_lp: torch.Tensor,
        previous_engine_lp: torch.Tensor | None,
        metrics: dict[str, float],
    ) -> None:
        """A low-precision engine's gap to the actor grows as training sharpens the model (module docstring), so a
        fixed bound on it either misses stale weights or stops healthy runs. What a push must do instead: move the
        engine's log-probs as far as the update moved the actor's. A stale engine does not move at all."""
        dtype = str(self.engine_dtype).removeprefix("torch.")
        if previous_actor_lp is None or previous_engine_lp is None:  # the first push: it must be the same model
            if not mean_gap <= LOW_PRECISION_FIRST_GAP:
                raise TrainingError(
                    f"step {step}: right after loading the actor's weights the {dtype} rollout engine's "
                    f"log-probs differ from the actor's by {mean_gap:.4g} on average on the probe sequence, more than "
                    f"a precision accounts for ({LOW_PRECISION_FIRST_GAP}): the engine does not compute what the "
                    "actor computes (another model or broken weights)"
                )
            return
        actor_moved = float((actor_lp - previous_actor_lp).abs().mean())
        engine_moved = float((engine_lp - previous_engine_lp).abs().mean())
        metrics["rollout/probe_actor_moved"] = actor_moved
        metrics["rollout/probe_engine_moved"] = engine_moved
        if actor_moved > self.threshold * MOVEMENT_FLOOR and engine_moved < 0.5 * actor_moved:
            raise TrainingError(
                f"step {step}: the update moved the actor's log-probs on the probe sequence by {actor_moved:.4g} on "
                f"average, but the weight push moved the {dtype} rollout engine's by {engine_moved:.4g}: "
                "the engine is generating from stale weights (the update did not reach it)"
            )


class PushPartner:
    """A trainer rank's part in a push it does not send (several trainer ranks beside rollout ranks: the leading
    rank sends, ``dapo.training.rank_split``). A sharded actor's push and probe are collectives of every trainer rank:
    this rank gathers each parameter in the same order and runs the probe's actor forward on the same sequence as
    the leader (:meth:`WeightSync.push`); a replicated actor's push involves no other rank, so here it is nothing."""

    engine = None

    def __init__(
        self,
        model: torch.nn.Module,
        probe_ids: Sequence[int],
        *,
        enabled: bool = True,
        engine_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.prompt, self.response = probe_halves(probe_ids)
        self.enabled, self.engine_dtype = enabled, engine_dtype

    def push(self, step: int) -> dict[str, float]:
        if not is_sharded(self.model):
            return {}
        for _ in sharded_push(self.model):  # the same gathers, in the same order, as the leader's push
            pass
        if self.enabled:
            actor_log_probs_of(self.model, self.prompt, self.response, compute_dtype=self.engine_dtype)
        return {}
