"""MoE routing replay (R3 / R2) on Hugging Face routers: record which experts each token went to, and route later
passes to the same experts.

A mixture-of-experts layer sends each token to the top-k experts of its router. The rollout engine and the actor
compute the router logits in different orders of summation (a KV cache and one query per step against one
teacher-forced pass), so where two experts are nearly tied they can pick different experts: the same token then goes
through a different MLP, and its log-prob differs by far more than round-off (the train-inference mismatch that
collapses MoE RL without replay, NVIDIA/Megatron-LM#4168). Replay fixes the choice, not the weights: the experts are
the recorded ones, but their gate weights are computed from the live router logits (the family's own gate function,
over the live logits at the replayed ids), so the router still receives a gradient and keeps learning.

:func:`router_replay` patches the forward of every router of a model (its Transformers class must be in
:data:`ROUTER_GATES`) for the duration of a block and hands out its :class:`RouterTape`, which each pass uses:

* :meth:`RouterTape.recording`: every forward's selected ids are kept per layer (the engine reads them after each
  forward: R3's rollout routes; the actor's old-log-prob pass: R2's);
* :meth:`RouterTape.replaying`: the next forwards route each token to the given ids (-1: route it live), and
  count, over the tokens marked counted, how many token x layer top-k sets the live router picked the same way
  (the routing agreement) and how many tokens each expert received (the expert load);
* :meth:`RouterTape.checkpoint_contexts`: under activation checkpointing (``actor.gradient_checkpointing``), a
  layer's recomputation in the backward replays the plan its forward ran under (the plan is over by then), neither
  counting nor recording again, so the backward differentiates the experts the forward used;
* :meth:`RouterTape.uncounted`: forwards replay but do not count (a zero-weight padding pass of an FSDP2 rank).

Outside the block the routers' forwards are their own again; a model never entered runs unpatched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = [
    "ROUTER_GATES",
    "RouterTape",
    "hf_model_of",
    "moe_problem",
    "moe_routers",
    "recompute_replays",
    "router_replay",
    "tape_of",
]

# The dtype routes are carried in (expert ids < 32768; -1 marks a token with no recorded route).
ROUTE_DTYPE = torch.int16


def _softmax_gate(router: nn.Module, logits: Tensor, ids: Tensor) -> Tensor:
    """Qwen3-MoE, Qwen3.5-MoE: softmax over every expert's logit (fp32), taken at the chosen ids, renormalised over
    them where the router does (Qwen3.5-MoE always does: it has no ``norm_topk_prob``)."""
    weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, ids)
    if getattr(router, "norm_topk_prob", True):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


def _softmax_of_chosen_gate(router: nn.Module, logits: Tensor, ids: Tensor) -> Tensor:
    """GPT-OSS: softmax over the chosen experts' logits only."""
    return torch.softmax(logits.gather(-1, ids), dim=-1, dtype=logits.dtype)


def _sigmoid_gate(router: nn.Module, logits: Tensor, ids: Tensor) -> Tensor:
    """DeepSeek-V3: the sigmoid of the chosen logits (the score-correction bias only chooses, it does not weigh),
    renormalised where the router does, times the routed scaling factor."""
    weights = logits.sigmoid().gather(-1, ids)
    if router.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * router.routed_scaling_factor


# Router classes of Transformers (>= 5: forward(hidden) -> (logits, weights, ids)) and how each weighs its experts.
ROUTER_GATES: dict[str, Callable[[nn.Module, Tensor, Tensor], Tensor]] = {
    "Qwen3MoeTopKRouter": _softmax_gate,
    "Qwen3_5MoeTopKRouter": _softmax_gate,
    "GptOssTopKRouter": _softmax_of_chosen_gate,
    "DeepseekV3TopkRouter": _sigmoid_gate,
}
# Config fields that make a model a mixture of experts, whichever family spells them.
_EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The routers of ``model`` that can be replayed, in layer order (one per MoE layer)."""
    return [m for m in model.modules() if type(m).__name__ in ROUTER_GATES]


def moe_problem(model: nn.Module) -> str | None:
    """Why ``model``'s routing cannot be replayed (not a mixture of experts, or a router class not in
    :data:`ROUTER_GATES`), or None."""
    if moe_routers(model):
        return None
    config = getattr(hf_model_of(model), "config", None)
    if not any(getattr(config, name, None) for name in _EXPERT_COUNT_FIELDS):
        return f"{type(hf_model_of(model)).__name__} is not a mixture-of-experts model (it has no router to replay)"
    kinds = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if "router" in type(m).__name__.lower() or type(m).__name__.endswith("Gate")
        }
    )
    return (
        f"{type(hf_model_of(model)).__name__}'s router ({', '.join(kinds) or 'not found'}) is not one dapo can "
        f"replay (known: {', '.join(ROUTER_GATES)})"
    )


@dataclass
class _Plan:
    replay: Tensor | None  # [tokens, layers, k] ids, -1 = live
    counted: Tensor | None  # [tokens] bool: the tokens that enter agreement and load


class RouterTape:
    """The routes of one model's MoE layers: what its forwards chose, what they are to choose, and how the live
    router agreed. ``rollout_routes``: the engine records every sample's routes (R3)."""

    def __init__(self, routers: list[nn.Module], *, rollout_routes: bool) -> None:
        self.routers = routers
        self.rollout_routes = rollout_routes
        self.num_layers = len(routers)
        self.top_k = int(routers[0].top_k)
        self.num_experts = int(routers[0].num_experts)
        self._recording = False
        self._counting = True
        self._recorded: list[Tensor | None] = [None] * self.num_layers
        self._plan = _Plan(None, None)
        # Per sample, the routes of the last recorded pass, as the pass that knows the samples left them (the actor).
        self.samples: list[Tensor] = []
        self.reset_counts()

    @property
    def recording_now(self) -> bool:
        return self._recording

    # ------------------------------------------------------------------------------------------------ passes
    @contextmanager
    def recording(self) -> Iterator[RouterTape]:
        """Inside, every forward keeps the ids each layer routed to; :meth:`take` returns them."""
        self._recording = True
        try:
            yield self
        finally:
            self._recording = False
            self._recorded = [None] * self.num_layers

    def take(self) -> Tensor:
        """The last forward's routes, ``[tokens, layers, k]`` (:data:`ROUTE_DTYPE`)."""
        if any(r is None for r in self._recorded):
            raise RuntimeError("RouterTape.take: no forward was recorded in every MoE layer")
        routes = torch.stack(self._recorded, dim=1).to(ROUTE_DTYPE)  # type: ignore[arg-type]
        self._recorded = [None] * self.num_layers
        return routes

    @contextmanager
    def replaying(self, replay: Tensor | None, counted: Tensor | None = None) -> Iterator[None]:
        """Inside, each forward's token ``t`` goes to ``replay[t, layer]`` (a row with a -1: live) and the tokens
        ``counted`` add to the agreement and load counts. ``replay`` None: every token routes live (counted still
        counts the load)."""
        self._plan = _Plan(replay, counted)
        try:
            yield
        finally:
            self._plan = _Plan(None, None)

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Inside, forwards replay their plans but add nothing to the agreement and load counts: a pass whose tokens
        train nothing (an FSDP2 rank's zero-weight padding pass, ``dapo.actor.mini_batch_plan``) would otherwise count
        a sample twice, and only on the ranks that pad."""
        outer, self._counting = self._counting, False
        try:
            yield
        finally:
            self._counting = outer

    def checkpoint_contexts(self) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
        """``torch.utils.checkpoint``'s (forward, recompute) contexts for one checkpointed layer, taken as its forward
        starts: the recompute, which runs in the backward after :meth:`replaying` has ended (and maybe after the next
        micro-batch's plan began), routes by the plan that forward ran under. The plan is kept, not consumed, so a
        second recompute replays the same routes; it neither counts nor records (the forward did)."""
        return nullcontext(), self._recomputing(self._plan)

    @contextmanager
    def _recomputing(self, plan: _Plan) -> Iterator[None]:
        outer, recording = self._plan, self._recording
        self._plan, self._recording = _Plan(plan.replay, None), False
        try:
            yield
        finally:
            self._plan, self._recording = outer, recording

    # ------------------------------------------------------------------------------------------------ counts
    def reset_counts(self) -> None:
        self.matched = 0  # token x layer top-k sets the live router picked as replayed
        self.compared = 0
        self.load = torch.zeros(self.num_layers, self.num_experts, dtype=torch.long)

    def agreement(self) -> float | None:
        """Fraction of the compared token x layer top-k sets that the live router chose as replayed, or None."""
        return self.matched / self.compared if self.compared else None

    def load_fractions(self) -> Tensor | None:
        """``[layers, experts]``: the share of each layer's counted routed slots that went to each expert
        (1 / experts everywhere when balanced), or None before any token was counted."""
        total = self.load.sum(dim=-1, keepdim=True)
        return None if int(total.min()) == 0 else self.load.double() / total

    # ------------------------------------------------------------------------------------------------ forward
    def route(
        self,
        layer: int,
        router: nn.Module,
        forward: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]],
        gate: Callable[[nn.Module, Tensor, Tensor], Tensor],
        hidden: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One router call under the tape: the live routes, replaced where the plan says, with gate weights from the
        live logits (``gate``: the family's, from :data:`ROUTER_GATES`)."""
        logits, weights, ids = forward(hidden)
        plan = self._plan
        if plan.replay is not None:
            want = plan.replay[:, layer].to(device=ids.device, dtype=ids.dtype)
            if want.shape != ids.shape:
                raise ValueError(
                    f"router replay: {tuple(want.shape)} routes for a layer that routed {tuple(ids.shape)}"
                )
            replayed = (want >= 0).all(dim=-1)
            if plan.counted is not None and self._counting:
                compare = replayed & plan.counted.to(ids.device)
                same = (want.sort(dim=-1).values == ids.sort(dim=-1).values).all(dim=-1)
                self.matched += int((same & compare).sum())
                self.compared += int(compare.sum())
            ids = torch.where(replayed[:, None], want, ids)
            weights = gate(router, logits, ids)
        if plan.counted is not None and self._counting:
            chosen = ids[plan.counted.to(ids.device)].reshape(-1)
            self.load[layer] += torch.bincount(chosen, minlength=self.num_experts).cpu()
        if self._recording:
            self._recorded[layer] = ids.detach()
        return logits, weights, ids


_MARK = "_dapo_router_tape"


def hf_model_of(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside an FSDP2 wrapper or a PEFT model (where the tape is kept)."""
    model = getattr(model, "hf_model", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def tape_of(model: nn.Module) -> RouterTape | None:
    """The :class:`RouterTape` of ``model`` inside :func:`router_replay`, or None (no replay: the default)."""
    return getattr(hf_model_of(model), _MARK, None)


def recompute_replays(model: nn.Module) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    """``context_fn`` of ``torch.utils.checkpoint`` (non-reentrant) for ``model``'s checkpointed layers: the tape's
    :meth:`RouterTape.checkpoint_contexts` inside :func:`router_replay`, nothing outside it (looked up at each call:
    the tape is entered after checkpointing is switched on)."""
    tape = tape_of(model)
    return (nullcontext(), nullcontext()) if tape is None else tape.checkpoint_contexts()


@contextmanager
def router_replay(model: nn.Module, *, rollout_routes: bool) -> Iterator[RouterTape]:
    """Patch every router of ``model`` to run under one :class:`RouterTape` (yielded) for the block; refuse a model
    whose routing cannot be replayed (:func:`moe_problem`)."""
    problem = moe_problem(model)
    if problem is not None:
        raise ValueError(f"router replay: {problem}")
    routers = moe_routers(model)
    tape = RouterTape(routers, rollout_routes=rollout_routes)
    holder = hf_model_of(model)
    for layer, router in enumerate(routers):
        # the class and its gate as they are now: PEFT's LoRA on a router parametrizes it (a class of another
        # name) for the length of each forward
        def patched(
            hidden: Tensor,
            _layer: int = layer,
            _router: nn.Module = router,
            _forward: Callable = type(router).forward.__get__(router),
            _gate: Callable = ROUTER_GATES[type(router).__name__],
        ) -> tuple[Tensor, Tensor, Tensor]:
            return tape.route(_layer, _router, _forward, _gate, hidden)

        router.forward = patched  # an instance attribute: the class's forward is untouched
    setattr(holder, _MARK, tape)
    try:
        yield tape
    finally:
        delattr(holder, _MARK)
        for router in routers:
            del router.forward
