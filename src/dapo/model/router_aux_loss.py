"""The MoE router's load-balancing auxiliary loss in the actor's update (``actor.router_aux_loss_coef``), as the
Hugging Face model computes it with ``output_router_logits=True``.

A family's Transformers module defines ``load_balancing_loss_func`` (Switch Transformer's loss: experts x the sum
over experts of the share of top-k slots it got times its mean router probability; 1.0 when balanced), and its
causal LM adds ``router_aux_loss_coef`` times it to the language-model loss. The actor computes ``lm_head`` itself
and calls the decoder, so it never gets that term: :func:`router_aux_loss` keeps the router logits of each forward
run inside :meth:`RouterLogits.capturing` (a forward hook on every router, the tensor Transformers' own
``output_router_logits`` records), and :meth:`RouterLogits.loss` hands them to the family's own function, with the
attention mask that leaves padding out. The update adds ``coef`` times it (``dapo.actor.update``).

Capture is on only around the forward: the recomputation of activation checkpointing in backward adds nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import Tensor, nn

from dapo.model.router_replay import hf_model_of, moe_routers

__all__ = ["RouterLogits", "aux_loss_of", "aux_loss_problem", "router_aux_loss"]

_MARK = "_dapo_router_logits"


def _loss_function(model: nn.Module) -> Callable[..., Tensor] | None:
    """The family's ``load_balancing_loss_func`` from its Transformers module, or None."""
    module = importlib.import_module(type(hf_model_of(model)).__module__)
    return getattr(module, "load_balancing_loss_func", None)


def aux_loss_problem(model: nn.Module) -> str | None:
    """Why ``model`` has no load-balancing auxiliary loss dapo can add (not a MoE model dapo knows the routers of,
    or a family Transformers computes none for), or None."""
    hf = hf_model_of(model)
    name = type(hf).__name__
    if not moe_routers(model):
        return f"{name} has no router dapo knows (a dense model, or a router class not in ROUTER_GATES)"
    if _loss_function(model) is None or not hasattr(hf.config, "output_router_logits"):
        return (
            f"{name} has no load-balancing auxiliary loss in Transformers (e.g. DeepSeek-V3 balances its experts "
            "with the router's score-correction bias instead)"
        )
    return None


class RouterLogits:
    """The router logits of the forwards run inside :meth:`capturing`, and the family's aux loss of them."""

    def __init__(self, model: nn.Module) -> None:
        hf = hf_model_of(model)
        self.routers = moe_routers(model)
        self.function = _loss_function(model)
        self.num_experts = int(self.routers[0].num_experts)
        self.top_k = int(self.routers[0].top_k)
        self._capturing = False
        self._logits: list[Tensor] = []
        self.name = type(hf).__name__

    def hook(self, module: nn.Module, inputs: object, output: tuple[Tensor, ...]) -> None:
        if self._capturing:
            self._logits.append(output[0])

    @contextmanager
    def capturing(self) -> Iterator[RouterLogits]:
        """Inside, every router call keeps its logits (``[tokens, experts]``), layer after layer."""
        self._logits, self._capturing = [], True
        try:
            yield self
        finally:
            self._capturing = False

    def loss(self, attention_mask: Tensor | None) -> Tensor:
        """The family's load-balancing loss of the logits captured by the last :meth:`capturing` block, over the
        tokens ``attention_mask`` marks (``[rows, width]`` as the forward's input; None: every token); the capture
        is emptied."""
        logits, self._logits = tuple(self._logits), []
        if len(logits) % len(self.routers):
            raise RuntimeError(f"router aux loss: {len(logits)} router calls for {len(self.routers)} MoE layers")
        assert self.function is not None
        return self.function(logits, self.num_experts, self.top_k, attention_mask)


def aux_loss_of(model: nn.Module) -> RouterLogits | None:
    """The :class:`RouterLogits` of ``model`` inside :func:`router_aux_loss`, or None (no aux loss: the default)."""
    return getattr(hf_model_of(model), _MARK, None)


@contextmanager
def router_aux_loss(model: nn.Module) -> Iterator[RouterLogits]:
    """Hook every router of ``model`` for the block, so the update can add the family's aux loss; refuse a model
    that has none (:func:`aux_loss_problem`)."""
    problem = aux_loss_problem(model)
    if problem is not None:
        raise ValueError(f"actor.router_aux_loss_coef: {problem}")
    capture = RouterLogits(model)
    handles = [router.register_forward_hook(capture.hook) for router in capture.routers]
    holder = hf_model_of(model)
    setattr(holder, _MARK, capture)
    try:
        yield capture
    finally:
        delattr(holder, _MARK)
        for handle in handles:
            handle.remove()
