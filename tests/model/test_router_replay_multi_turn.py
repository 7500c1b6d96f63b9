"""R3 through multi-turn tool rollouts (#35) on a tiny Qwen3-MoE with the HF engine and the calculator tool: every
position of prompt + trajectory carries the route the engine took there (model tokens of every turn, and tool
tokens, routed by the prefill of the call that read them), and the actor, replaying them on a router perturbed
until near-ties flip, computes the engine's log-probs on the model tokens of every turn where routing live does not.

A random model writes no arithmetic, so the call format is the turn's text up to its first "e" (112 of the 601
pieces of the embedded tokenizer hold one: a call every few tokens); the calculator refuses the text and its
``error: ...`` comes back as tool tokens, which the next turn reads."""

from __future__ import annotations

import pytest
import torch
from families import GAP_TOLERANCE, prompts
from test_router_replay import REPLAY_TOLERANCE, actor_log_probs, near_tied
from transformers import AutoTokenizer

from dapo.actor.batch import TrainBatch
from dapo.model.loading import EMBEDDED_MODEL_DIR
from dapo.model.router_replay import router_replay
from dapo.rollout.base import SamplingParams
from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.rollout.multi_turn import MultiTurnOutput, MultiTurnParams, MultiTurnRollout
from dapo.tools.calculator import CalculatorTool
from dapo.tools.call_format import ToolCallFormat
from dapo.tools.toolbox import Toolbox

UP_TO_E = ToolCallFormat(start="", end="e", response_template=" {output}\n")
TOP_K = 2


@pytest.fixture(scope="module")
def rollout() -> tuple[torch.nn.Module, torch.nn.Module, list[list[int]], MultiTurnOutput]:
    """The near-tied pair (test_router_replay.near_tied), and a multi-turn rollout of the unperturbed one with its
    routes recorded."""
    tied, flipped = near_tied(TOP_K)
    tokenizer = AutoTokenizer.from_pretrained(str(EMBEDDED_MODEL_DIR))
    engine = HFRolloutEngine(tied, eos_token_ids=[2], pad_token_id=0)
    params = MultiTurnParams(max_assistant_turns=3, max_response_length=40, max_tool_response_length=6)
    batch = prompts(0)
    with router_replay(tied, rollout_routes=True):
        out = MultiTurnRollout(engine, tokenizer, Toolbox([CalculatorTool(UP_TO_E)]), params).generate(
            batch, SamplingParams(n=2, temperature=1.0, seed=3, prompt_seeds=(5, 6, 7))
        )
    return tied, flipped, batch, out


def train_batch(batch: list[list[int]], out: MultiTurnOutput, routes: list[torch.Tensor] | None) -> TrainBatch:
    count = len(out)
    return TrainBatch(
        prompt_ids=[torch.tensor(batch[i]) for i in out.prompt_index],
        response_ids=[torch.tensor(r) for r in out.response_ids],
        advantages=torch.zeros(count),
        sample_mask=torch.ones(count, dtype=torch.bool),
        group_index=torch.tensor(out.prompt_index),
        action_mask=[torch.tensor(m, dtype=torch.bool) for m in out.action_mask],
        routed_experts=routes,
    )


def turn_gaps(actor: list[torch.Tensor], out: MultiTurnOutput) -> tuple[float, float]:
    """The largest |actor - engine| log-prob over the model tokens of the first turn, and of the later turns."""
    first = later = 0.0
    for lps, engine, mask in zip(actor, out.logprobs, out.action_mask, strict=True):
        model = torch.tensor(mask, dtype=torch.bool)
        later_turn = torch.cumsum((~model).int(), 0) > 0  # a tool output came before
        gap = torch.cat([(lps - torch.tensor(engine)).abs(), torch.zeros(1)])  # a 0 for a sample with no later turn
        first = max(first, float(gap[torch.cat([model & ~later_turn, torch.ones(1, dtype=torch.bool)])].max()))
        later = max(later, float(gap[torch.cat([model & later_turn, torch.ones(1, dtype=torch.bool)])].max()))
    return first, later


def forward_routes(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """The ``[tokens, layers, k]`` experts a teacher-forced forward of ``model`` routes ``token_ids`` to."""
    with router_replay(model, rollout_routes=True) as tape, tape.recording(), torch.no_grad():
        model(torch.tensor([token_ids]))
        return tape.take()


def test_the_tool_is_called_and_every_token_but_the_last_carries_the_route_it_took(rollout) -> None:
    """A route at a position depends only on the tokens up to it (a causal model), so one teacher-forced forward over
    prompt + trajectory routes each position as the engine call that fed it did (same weights): the model tokens
    of each turn (recorded while drawing) and the tool tokens (recorded by the next call's prefill) alike. Only the
    tokens no call fed have none (-1): the last model token, and after it a tool output the budget ended on."""
    tied, _, batch, out = rollout
    assert out.routed_experts is not None
    assert sum(out.tool_calls) >= 6 and max(out.turns) == 3, (out.tool_calls, out.turns)
    for k, routes in enumerate(out.routed_experts):
        prompt, mask = batch[out.prompt_index[k]], out.action_mask[k]
        tokens = prompt + out.response_ids[k]
        unfed = len(prompt) + max(t for t, m in enumerate(mask) if m)  # the last model token, and what follows it
        assert routes.shape == (len(tokens), 2, TOP_K)
        assert torch.equal(routes[:unfed], forward_routes(tied, tokens)[:unfed]), f"sample {k}"
        assert bool((routes[unfed:] == -1).all())


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_replayed_on_the_same_weights_the_actor_agrees_everywhere_and_matches_the_engine(rollout, layout) -> None:
    """Agreement 1.0 counts every position with a route: a route laid one turn's tool tokens off is another
    token's, which the live router does not pick (checked below on the routes shifted so)."""
    tied, _, batch, out = rollout
    with router_replay(tied, rollout_routes=True) as tape:
        replayed = actor_log_probs(tied, train_batch(batch, out, out.routed_experts), layout)
        assert tape.agreement() == 1.0
        assert max(turn_gaps(replayed, out)) <= GAP_TOLERANCE
        tape.reset_counts()
        actor_log_probs(tied, train_batch(batch, out, shifted_after_first_tool_output(out)), layout)
        assert tape.agreement() < 0.9


def shifted_after_first_tool_output(out: MultiTurnOutput) -> list[torch.Tensor]:
    """The misalignment this guards against: every route after a sample's first tool output taken from that many
    positions later (as a stitching that forgot the tool tokens of one turn would lay them)."""
    shifted = []
    for routes, mask, ids in zip(out.routed_experts, out.action_mask, out.response_ids, strict=True):
        moved = routes.clone()
        if 0 in mask:
            first = mask.index(0)
            width = mask.index(1, first) - first if 1 in mask[first:] else len(mask) - first
            start = routes.shape[0] - len(ids) + first
            moved[start : len(moved) - width] = routes[start + width :]
        shifted.append(moved)
    return shifted


def test_r3_gives_the_engines_log_probs_in_every_turn_after_a_perturbation_flips_the_routes(rollout) -> None:
    """The actor on the perturbed router: live, tokens of the first turn and of the later ones alike take another
    expert's MLP (> 0.1 nats off); replaying the trajectory's routes restores the unperturbed actor's log-probs
    (REPLAY_TOLERANCE) and so the engine's, in every turn. A later turn reads the earlier turns and the tool output
    through their keys and values, so it needs their routes too, at their positions."""
    tied, flipped, batch, out = rollout
    live = actor_log_probs(flipped, train_batch(batch, out, None))
    assert min(turn_gaps(live, out)) > 0.1
    unperturbed = actor_log_probs(tied, train_batch(batch, out, None))
    with router_replay(flipped, rollout_routes=True) as tape:
        replayed = actor_log_probs(flipped, train_batch(batch, out, out.routed_experts))
        assert tape.agreement() < 0.9  # the live router did flip, and the replay overrode it
    for r, u, mask in zip(replayed, unperturbed, out.action_mask, strict=True):
        assert float((r - u)[torch.tensor(mask, dtype=torch.bool)].abs().max()) <= REPLAY_TOLERANCE[TOP_K]
    assert max(turn_gaps(replayed, out)) <= GAP_TOLERANCE
