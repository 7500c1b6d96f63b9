"""A sample's MoE routes (R3, ``RolloutOutput.routed_experts``) stitched over the engine calls that generated it:
the segments of a partial rollout (dapo.rollout.worker) and the turns of a multi-turn trajectory
(dapo.rollout.multi_turn).

Each call re-prefills everything the sample has so far and records the routes of that prefill and of the tokens it
draws, so a token is routed again by every later call. The routes kept are the ones recorded when the token was
first fed: they are what the engine computed the sample's next token from, under the weights of their time. The one
exception is the last token a call kept: that call never fed it (or fed it only to draw tokens that were dropped,
a multi-turn turn cut at its call's end), so the route that mattered is the next call's, whose prefill feeds it for
the tokens that follow. Tokens appended between two calls (a tool's output) are first fed by the next call's prefill,
which routes them as a single call routes its prompt. A token no call ever fed (the last one, a tool output the
budget ended on) has no route: -1, the actor routes it live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["routes_so_far", "unfed_routes_appended"]


def routes_so_far(kept: torch.Tensor | None, call: torch.Tensor) -> torch.Tensor:
    """A sample's routes after one more engine call. ``kept``: ``[tokens, layers, k]`` over the tokens the sample had
    after the previous call (None or empty before the first); ``call``: the call's, over what it was given (the
    sample so far, with anything appended since) and the tokens it drew. The kept tokens keep theirs but the last;
    from there on the call's (module docstring)."""
    import torch

    if kept is None or kept.shape[0] == 0:
        return call
    if call.shape[0] < kept.shape[0]:
        raise ValueError(
            f"routes_so_far: the call routed {call.shape[0]} tokens, fewer than the {kept.shape[0]} the sample had"
        )
    return torch.cat([kept[: kept.shape[0] - 1], call[kept.shape[0] - 1 :]])


def unfed_routes_appended(routes: torch.Tensor, tokens: int) -> torch.Tensor:
    """``routes`` grown to cover ``tokens`` tokens, the new ones with no route (-1: routed live by the actor): the
    tokens appended after the sample's last call, which no call fed."""
    import torch

    missing = tokens - routes.shape[0]
    if missing < 0:
        raise ValueError(f"unfed_routes_appended: {routes.shape[0]} routes for {tokens} tokens")
    return torch.cat([routes, routes.new_full((missing, *routes.shape[1:]), -1)])
