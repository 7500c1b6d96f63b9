"""R3 through multi-turn rollouts (#35): each engine call's routes stitched onto the trajectory
(dapo.rollout.sample_routes), position by position, on an engine whose every route names the call and the position
that recorded it. tests/model/test_router_replay_multi_turn.py runs the same on a real MoE model."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo.rollout.base import RolloutOutput, SamplingParams
from dapo.rollout.multi_turn import MultiTurnParams, MultiTurnRollout, ToolCallFormat
from dapo.tools.result import ToolResult
from tests.harness.tokenizers import WordTokenizer

# "=" and ">" are separate pieces, so no token holds the call's end "=>": the engine never stops on it, the turn runs
# to the end of the call's answer and the rollout cuts it after ">" (the tokens drawn after it are dropped).
TOKENIZER = WordTokenizer(["a", "b", "=", ">", "<r>", "R", "</r>"])
A, B, EQ, GT = (TOKENIZER.pieces.index(p) for p in ("a", "b", "=", ">"))
TOOL_TOKENS = TOKENIZER.encode("<r>R</r>")
FORMAT = ToolCallFormat(start="", end="=>", response_template="<r>{output}</r>")


class Answering:
    """Prints "R" for every call."""

    def run_many(self, codes: Sequence[str], max_workers: int = 1) -> list[ToolResult]:
        return [ToolResult(output="R", category="ok", exit_code=0, wall_s=0.0) for _ in codes]


class RouteNamingEngine:
    """Call ``c`` (from 1) answers ``answers[c - 1]`` to every row and routes position ``t`` of what the row was
    given and drew to expert ``100 c + t`` (one layer, top-1), the last token drawn to -1 (never fed), as the HF
    engine records; an answer ending on EOS stops, any other is cut by max_tokens; a call not in ``routing_calls`` records nothing (an engine not asked to)."""

    def __init__(self, answers: list[list[int]], routing_calls: frozenset[int] = frozenset({1, 2, 3})) -> None:
        self.answers, self.routing_calls, self.calls = answers, routing_calls, 0

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        self.calls += 1
        answer = self.answers[self.calls - 1][: params.max_tokens]
        rows = [i for i in range(len(prompts)) for _ in range(params.n)]
        routes = []
        for i in rows:
            tokens = len(prompts[i]) + len(answer)
            route = 100 * self.calls + torch.arange(tokens, dtype=torch.int16)
            route[-1] = -1
            routes.append(route.view(tokens, 1, 1))
        return RolloutOutput(
            rows,
            [list(answer) for _ in rows],
            [[-0.5] * len(answer) for _ in rows],
            ["stop" if answer[-1:] == [WordTokenizer.eos] else "length" for _ in rows],
            routed_experts=routes if self.calls in self.routing_calls else None,
        )


def test_each_token_keeps_the_route_of_the_call_that_fed_it_first_and_tool_tokens_the_next_calls() -> None:
    """Prompt (2 tokens); call 1 draws a = > b b, cut after ">"; the tool's 3 tokens; call 2 draws b = >, a call
    again; its tool output fills the budget (12), so no call follows. Expected, position by position: call 1's routes
    for the prompt and turn 1 but its last token (100..103); turn 1's last token (fed by call 1 only to draw the
    dropped b b), the tool tokens (read first by call 2's prefill) and turn 2 but its last: call 2's (204..209);
    turn 2's last token and the second tool output, never fed: -1. A route shifted by one turn's tool tokens, the
    tool tokens left unrouted, a first call's route kept for turn 1's last token, the last call's routes laid over
    every position (its prefill re-routed the earlier ones), or the dropped tokens' routes left in, fail it."""
    engine = RouteNamingEngine([[A, EQ, GT, B, B], [B, EQ, GT]])
    params = MultiTurnParams(max_assistant_turns=3, max_response_length=12, call_format=FORMAT)
    out = MultiTurnRollout(engine, TOKENIZER, Answering(), params).generate([[A, B]], SamplingParams(n=1))
    assert out.response_ids == [[A, EQ, GT, *TOOL_TOKENS, B, EQ, GT, *TOOL_TOKENS]]
    assert out.action_mask == [[1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]]
    assert out.finish_reason == ["length"] and engine.calls == 2
    expected = [100, 101, 102, 103, 204, 205, 206, 207, 208, 209, -1, -1, -1, -1]
    assert out.routed_experts is not None
    assert out.routed_experts[0].flatten().tolist() == expected


def test_one_call_without_routes_leaves_the_trajectories_without_routes() -> None:
    """Half a trajectory's routes would replay the rest live without saying so: none, as for an engine that records
    none (the R3 pass then stops the run naming why)."""
    rollout = MultiTurnRollout(
        RouteNamingEngine([[A, EQ, GT], [B, WordTokenizer.eos]], routing_calls=frozenset({1})),
        TOKENIZER,
        Answering(),
        MultiTurnParams(max_assistant_turns=2, call_format=FORMAT),
    )
    out = rollout.generate([[A, B]], SamplingParams(n=2))
    assert out.turns == [2, 2] and out.routed_experts is None
