"""MoE routing replay (dapo.model.router_replay, #35): the routes the HF engine records are the ones its forwards
took; replayed by the actor they restore the rollout's log-probs after a router perturbation flips a near-tie; gate
weights under replay come from the live logits (the router still gets a gradient); nothing is patched outside the
block."""

from __future__ import annotations

import math

import pytest
import torch
from families import FAMILIES, GAP_TOLERANCE, build_tiny_model, sampled_batch

from dapo.actor.log_probs import compute_log_probs_batch, compute_response_log_probs, resolve_layout
from dapo.config import build_config
from dapo.model.router_replay import moe_routers, router_replay

MOE_FAMILIES = [name for name, family in FAMILIES.items() if family.moe]


def actor_log_probs(model: torch.nn.Module, batch, layout: str = "padded") -> list[torch.Tensor]:
    with torch.no_grad():
        return compute_response_log_probs(
            model, batch, temperature=1.0, chunk_size=64, with_entropy=False, layout=layout
        )[0]


def largest_gap(a, b) -> float:
    return max(float((x - torch.as_tensor(y)).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("layout", ["padded", "packed", "shared_prompt"])
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_the_engines_routes_are_the_actors_and_replaying_them_changes_nothing(family: str, layout: str) -> None:
    """Same weights: the live actor picks every recorded top-k set (agreement 1.0 over every token x layer with a
    route), and replaying them gives the live log-probs bitwise: the family's gate weights are recomputed exactly as
    the family computes them. Every sample's routes cover its prompt and response; only the last response token,
    which the engine never feeds back, has none."""
    model = build_tiny_model(family)
    try:
        resolve_layout(layout, model)
    except ValueError as refused:  # the actor's own refusals (test_family_matrix)
        pytest.skip(str(refused))
    with router_replay(model, rollout_routes=True) as tape:
        batch, _ = sampled_batch(model)
        for routes, prompt, response in zip(batch.routed_experts, batch.prompt_ids, batch.response_ids, strict=True):
            assert routes.shape == (prompt.numel() + response.numel(), tape.num_layers, tape.top_k)
            assert bool((routes[:-1] >= 0).all()) and bool((routes[-1] == -1).all())
        replayed = actor_log_probs(model, batch, layout)
        assert tape.agreement() == 1.0
    live = actor_log_probs(model, batch.with_routed_experts(None), layout)
    assert all(torch.equal(r, v) for r, v in zip(replayed, live, strict=True))


def near_tied(top_k: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny Qwen3-MoE whose experts 2 and 3 have the same router row (every token ties them), and a copy whose
    row 3 is scaled by 1 + 1e-6: a token with a positive logit for them now picks 3 where it picked 2."""
    tied = build_tiny_model("qwen3_moe", num_experts_per_tok=top_k)
    with torch.no_grad():
        for router in moe_routers(tied):
            router.weight[3] = router.weight[2]
    flipped = build_tiny_model("qwen3_moe", num_experts_per_tok=top_k)
    flipped.load_state_dict(tied.state_dict())
    with torch.no_grad():
        for router in moe_routers(flipped):
            router.weight[3] *= 1 + 1e-6
    return tied, flipped


# Replayed on the perturbed router, the log-probs equal the unperturbed actor's: bitwise with one expert per token
# (its normalised gate weight is exactly 1); with two, the perturbed row's logit moves the gate weight of a token
# routed to both tied experts by ~1e-6 relative, measured 2.4e-6 nats at most (fp32).
REPLAY_TOLERANCE = {1: 0.0, 2: 1e-5}


@pytest.mark.parametrize("layout", ["padded", "shared_prompt"])
@pytest.mark.parametrize("top_k", sorted(REPLAY_TOLERANCE))
def test_r3_restores_the_rollouts_log_probs_after_a_tiny_perturbation_flips_the_routes(top_k: int, layout: str) -> None:
    """On padded, and on shared_prompt: its prompt pass and response passes each replay their own tokens' routes."""
    tied, flipped = near_tied(top_k)
    with router_replay(tied, rollout_routes=True):
        batch, engine_log_probs = sampled_batch(tied)
    unperturbed = actor_log_probs(tied, batch.with_routed_experts(None), layout)
    assert largest_gap(unperturbed, engine_log_probs) <= GAP_TOLERANCE

    live = actor_log_probs(flipped, batch.with_routed_experts(None), layout)  # no replay: flipped take expert 3's MLP
    assert largest_gap(live, engine_log_probs) > 0.1

    with router_replay(flipped, rollout_routes=True) as tape:
        replayed = actor_log_probs(flipped, batch, layout)
        assert tape.agreement() < 0.9  # the live router did flip, and the replay overrode it
    assert largest_gap(replayed, unperturbed) <= REPLAY_TOLERANCE[top_k]
    assert largest_gap(replayed, engine_log_probs) <= GAP_TOLERANCE


def one_token_router() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    """A tiny Qwen3-MoE, its first router and one token whose logits over the four experts are (2, 1, 0, 1)."""
    model = build_tiny_model("qwen3_moe")
    router = moe_routers(model)[0]
    hidden = torch.zeros(1, router.hidden_dim)
    hidden[0, 0] = 1.0
    with torch.no_grad():
        router.weight.zero_()
        router.weight[:, 0] = torch.tensor([2.0, 1.0, 0.0, 1.0])
    return model, router, hidden


def test_gate_weights_under_replay_are_the_live_softmax_at_the_replayed_ids_and_train_the_router() -> None:
    """One token, logits (2, 1, 0, 1) over four experts, top-2 normalised (Qwen3-MoE): live it goes to experts 0 and
    1 (or 3); replayed to (2, 0), its weights are e^0 / (e^0 + e^2) = 0.1192 and e^2 / (e^0 + e^2) = 0.8808, and
    their gradient reaches exactly the two chosen rows of the router: d w_2 / d l_2 = w_2 w_0 = 0.1050, and
    -0.1050 for l_0, times the hidden state."""
    model, router, hidden = one_token_router()
    with router_replay(model, rollout_routes=False) as tape:
        with tape.replaying(torch.tensor([[[2, 0], [-1, -1]]]), torch.ones(1, dtype=torch.bool)):
            _, weights, ids = router(hidden)
        assert tape.agreement() == 0.0  # the live top-2 was {0, 1} or {0, 3}
    w2, w0 = 1 / (1 + math.e**2), math.e**2 / (1 + math.e**2)
    assert ids.tolist() == [[2, 0]]
    torch.testing.assert_close(weights, torch.tensor([[w2, w0]]), rtol=0, atol=1e-6)
    weights[0, 0].backward()
    grad = router.weight.grad[:, 0]
    torch.testing.assert_close(grad, torch.tensor([-w2 * w0, 0.0, w2 * w0, 0.0]), rtol=0, atol=1e-6)
    assert float(router.weight.grad[:, 1:].abs().max()) == 0.0


def test_an_uncounted_pass_replays_but_adds_nothing_to_agreement_or_load() -> None:
    """An FSDP2 rank's zero-weight padding pass (dapo.actor.update): the same one-token plan as above, replayed to
    (2, 0) whatever the live router picks, leaves the counts where they were; after the block it counts again."""
    model, router, hidden = one_token_router()
    plan = torch.tensor([[[2, 0], [-1, -1]]])
    with router_replay(model, rollout_routes=False) as tape:
        with tape.uncounted(), tape.replaying(plan, torch.ones(1, dtype=torch.bool)):
            _, _, ids = router(hidden)
        assert ids.tolist() == [[2, 0]]
        assert (tape.matched, tape.compared, int(tape.load.sum())) == (0, 0, 0)
        with tape.replaying(plan, torch.ones(1, dtype=torch.bool)):
            router(hidden)
        assert (tape.matched, tape.compared) == (0, 1) and tape.load[0].tolist() == [1, 0, 1, 0]


@pytest.mark.parametrize("layout", ["padded", "shared_prompt"])
def test_r2_records_the_actors_own_routes_for_every_token(layout: str) -> None:
    """The old-log-prob pass inside the tape's recording leaves each sample's routes in batch order: the engine's
    where it recorded one (same weights); padded feeds the last response token too and routes it, shared_prompt
    does not (-1, as the engine), and gives every sample of a prompt row the row's prompt routes."""
    model = build_tiny_model("qwen3_moe")
    cfg = build_config({}, [f"actor.layout={layout}", "actor.ppo_max_token_len_per_gpu=40"]).actor
    with router_replay(model, rollout_routes=True) as tape:
        batch, _ = sampled_batch(model)
        with tape.recording():
            compute_log_probs_batch(model, batch.with_routed_experts(None), cfg, 1.0)
            recorded = list(tape.samples)
    assert len(recorded) == len(batch)
    for mine, engines in zip(recorded, batch.routed_experts, strict=True):
        assert bool((mine[:-1] >= 0).all()) and bool((mine[-1] >= 0).all()) == (layout == "padded")
        assert torch.equal(mine[:-1], engines[:-1])


def test_shared_prompt_gives_samples_whose_prompt_routes_differ_rows_of_their_own() -> None:
    """One pass routes a prompt row one way: a sample of the same prompt tokens but other recorded prompt routes
    (e.g. drawn under other weights) gets its own row, so shared_prompt replays what padded replays. Sharing the row
    by tokens alone would replay the first sample's prompt routes for it (> 0.1 nats off)."""
    model = build_tiny_model("qwen3_moe")
    with router_replay(model, rollout_routes=True) as tape:
        batch, _ = sampled_batch(model)
        routes = [r.clone() for r in batch.routed_experts]
        prompt = batch.prompt_ids[1].numel()
        assert torch.equal(batch.prompt_ids[1], batch.prompt_ids[0])
        routes[1][:prompt] = (routes[1][:prompt] + 1) % tape.num_experts  # other experts, still distinct
        moved = batch.with_routed_experts(routes)
        padded = actor_log_probs(model, moved, "padded")
        shared = actor_log_probs(model, moved, "shared_prompt")
        assert largest_gap(padded, actor_log_probs(model, batch, "padded")) > 0.1  # the moved routes matter
    assert largest_gap(shared, padded) <= GAP_TOLERANCE


def test_outside_the_block_nothing_is_patched_and_a_dense_model_is_refused() -> None:
    model = build_tiny_model("qwen3_moe")
    with router_replay(model, rollout_routes=True):
        assert all("forward" in vars(r) for r in moe_routers(model))
    assert not any("forward" in vars(r) for r in moe_routers(model))
    with pytest.raises(ValueError, match="Qwen3ForCausalLM is not a mixture-of-experts model"):
        with router_replay(build_tiny_model("qwen3"), rollout_routes=True):
            pass


def test_a_lora_adapted_router_is_replayed() -> None:
    """PEFT's all-linear adapts Qwen3-MoE's router (``mlp.gate``, the LoRA table of docs/models.md) by
    parametrizing it for each forward, under a class of another name: it is still recorded and replayed."""
    from dapo.model.lora import apply_lora

    model = apply_lora(build_tiny_model("qwen3_moe"), build_config({}, ["model.lora_rank=4"]).model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # an adapter that changes the logits
                parameter.normal_()
    with router_replay(model, rollout_routes=True) as tape:
        batch, engine_log_probs = sampled_batch(model)
        replayed = actor_log_probs(model, batch)
        assert tape.agreement() == 1.0
    assert largest_gap(replayed, engine_log_probs) <= GAP_TOLERANCE
