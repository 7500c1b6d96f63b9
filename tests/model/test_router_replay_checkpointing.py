"""MoE routing replay under activation checkpointing (actor.gradient_checkpointing, dapo.model.router_replay): the
backward's recomputation of each checkpointed layer (padded: Transformers' per-layer checkpointing; shared_prompt:
the layout's own per-pass checkpoint) replays the routes its forward replayed, so the gradients equal those of the
same replayed pass without checkpointing; a recomputation that routes live does not."""

from __future__ import annotations

import pytest
import torch
from families import sampled_batch
from test_router_replay import near_tied

from dapo.actor.log_probs import compute_response_log_probs
from dapo.actor.update import configure_model_for_training
from dapo.config import build_config
from dapo.model.router_replay import router_replay


def replayed_gradients(model: torch.nn.Module, batch, *, checkpointing: bool, layout: str) -> dict[str, torch.Tensor]:
    """Each parameter's gradient of the summed response log-probs, the rollout's routes replayed (R3)."""
    cfg = build_config(
        {},
        [
            "actor.router_replay.mode=R3",
            f"actor.layout={layout}",
            f"actor.gradient_checkpointing={str(checkpointing).lower()}",
        ],
    ).actor
    configure_model_for_training(model, cfg)
    with router_replay(model, rollout_routes=True) as tape:
        log_probs, _ = compute_response_log_probs(
            model,
            batch,
            temperature=1.0,
            chunk_size=64,
            with_entropy=False,
            layout=layout,
            checkpoint_passes=cfg.gradient_checkpointing,
        )
        compared = tape.compared
        torch.cat(log_probs).sum().backward()
        assert tape.compared == compared  # the recomputation neither counts nor records
        assert tape.agreement() < 0.9  # the live router flipped routes, which replay overrode
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", ["padded", "shared_prompt"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_the_recomputation_replays_the_forwards_routes(top_k: int, layout: str) -> None:
    tied, _ = near_tied(top_k)
    with router_replay(tied, rollout_routes=True):
        batch, _ = sampled_batch(tied)
    _, plain = near_tied(top_k)
    _, checkpointed = near_tied(top_k)
    expected = replayed_gradients(plain, batch, checkpointing=False, layout=layout)
    got = replayed_gradients(checkpointed, batch, checkpointing=True, layout=layout)
    # shared_prompt checkpoints its own passes: Transformers' per-layer checkpointing stays off
    assert checkpointed.is_gradient_checkpointing == (layout == "padded") and not plain.is_gradient_checkpointing
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=0, atol=1e-6, msg=name)
