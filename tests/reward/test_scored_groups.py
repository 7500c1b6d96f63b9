"""score_rollout and ScoredGroup (dapo.reward.scored_groups): decoding without special tokens, the rule reward, the
soft overlong punishment (Eq. 13) on hand-computed lengths, regrouping samples by prompt, the custom reward function
hook, the shaped reward / token count properties, the JSON state round trip, and group_index_of.

Real tokenizer (the shipped tiny Qwen2's), real scorers, a hand-built RolloutOutput."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

import dapo
from dapo.config import DapoConfig, build_config
from dapo.data.prompts import PromptItem
from dapo.reward.scored_groups import ScoredGroup, group_index_of, score_rollout
from dapo.rollout.base import RolloutOutput

ASSET = Path(dapo.__file__).parent / "assets" / "tiny-qwen2"

# L_max = 20, L_cache = 10: no penalty up to 10 tokens, then linearly down to -1 at 20 tokens.
OVERRIDES = ["data.max_response_length=20", "reward_model.overlong_buffer.len=10"]

PROMPTS = [
    PromptItem(0, (5, 6, 7), "42", "math_dapo"),
    PromptItem(1, (8, 9), "7", "synth_val", {"note": "kept for scorers"}),
    PromptItem(2, (3,), "1", "math_dapo"),  # no samples in the rollout: no group
]


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(ASSET, local_files_only=True)


def _response(tokenizer, text: str, length: int, *, eos: bool = True) -> list[int]:  # type: ignore[no-untyped-def]
    """Token ids decoding to 'xx...x' + text (+ EOS): exactly ``length`` tokens."""
    body = tokenizer.encode(text, add_special_tokens=False)
    filler = tokenizer.encode("x", add_special_tokens=False)
    assert len(filler) == 1
    tail = [tokenizer.eos_token_id] if eos else []
    ids = filler * (length - len(body) - len(tail)) + body + tail
    assert len(ids) == length
    return ids


def _rollout(tokenizer, prompt_index: list[int] | None = None) -> RolloutOutput:  # type: ignore[no-untyped-def]
    """Four samples, interleaved between prompts 1 and 0 (score_rollout must regroup them)."""
    responses = [
        _response(tokenizer, "\nAnswer: 7", 8),  # prompt 1: right, short -> +1, no penalty
        _response(tokenizer, "\nAnswer: 42", 15),  # prompt 0: right, 5 into the buffer -> +1, -0.5
        _response(tokenizer, "\nAnswer: 8", 10),  # prompt 1: wrong, exactly L_max - L_cache -> -1, 0
        _response(tokenizer, "\nAnswer: 41", 20, eos=False),  # prompt 0: cut at L_max -> -1, -1
    ]
    logprobs = [[-0.01 * (k + 1)] * len(r) for k, r in enumerate(responses)]
    return RolloutOutput(
        prompt_index=prompt_index or [1, 0, 1, 0],
        response_ids=responses,
        logprobs=logprobs,
        finish_reason=["stop", "stop", "stop", "length"],
    )


def test_score_rollout_decodes_scores_penalises_and_regroups(tokenizer) -> None:  # type: ignore[no-untyped-def]
    rollout = _rollout(tokenizer)
    groups = score_rollout(PROMPTS, rollout, tokenizer, build_config({}, OVERRIDES))
    assert [g.prompt for g in groups] == PROMPTS[:2]  # sorted by prompt index; prompt 2 had no samples

    g0, g1 = groups
    # Prompt 0 got samples 1 and 3, in that order.
    assert g0.response_ids == [rollout.response_ids[1], rollout.response_ids[3]]
    assert g0.rollout_log_probs == [rollout.logprobs[1], rollout.logprobs[3]]
    assert g0.truncated == [False, True]
    assert g0.scores == [1.0, -1.0] and g0.acc == [True, False]
    assert g0.preds == ["42", "41"]  # the EOS was skipped when decoding, else the answer would read "42<|im_end|>"
    assert g0.overlong_penalty == pytest.approx([-0.5, -1.0])
    assert g0.rewards == pytest.approx([0.5, -2.0])

    # Prompt 1 got samples 0 and 2.
    assert g1.response_ids == [rollout.response_ids[0], rollout.response_ids[2]]
    assert g1.truncated == [False, False]
    assert g1.scores == [1.0, -1.0] and g1.acc == [True, False]
    assert g1.preds == ["7", "8"]
    assert g1.overlong_penalty == [0.0, 0.0]
    assert g1.rewards == [1.0, -1.0]


def test_score_rollout_field_types(tokenizer) -> None:  # type: ignore[no-untyped-def]
    groups = score_rollout(PROMPTS, _rollout(tokenizer), tokenizer, build_config({}, OVERRIDES))
    for g in groups:
        assert all(type(s) is float for s in g.scores + g.overlong_penalty)
        assert all(type(a) is bool for a in g.acc + g.truncated)
        assert all(type(p) is str for p in g.preds)
        assert all(type(r) is list and all(type(t) is int for t in r) for r in g.response_ids)


def test_contiguous_engine_layout_gives_the_same_groups(tokenizer) -> None:  # type: ignore[no-untyped-def]
    interleaved = _rollout(tokenizer)
    order = [1, 3, 0, 2]  # the engine's layout: prompt 0's samples, then prompt 1's
    contiguous = RolloutOutput(
        prompt_index=[interleaved.prompt_index[k] for k in order],
        response_ids=[interleaved.response_ids[k] for k in order],
        logprobs=[interleaved.logprobs[k] for k in order],
        finish_reason=[interleaved.finish_reason[k] for k in order],
    )
    cfg = build_config({}, OVERRIDES)
    assert score_rollout(PROMPTS, contiguous, tokenizer, cfg) == score_rollout(PROMPTS, interleaved, tokenizer, cfg)


def test_penalty_factor_scales_and_disabling_removes_the_penalty(tokenizer) -> None:  # type: ignore[no-untyped-def]
    half = score_rollout(
        PROMPTS,
        _rollout(tokenizer),
        tokenizer,
        build_config({}, [*OVERRIDES, "reward_model.overlong_buffer.penalty_factor=0.5"]),
    )
    assert half[0].overlong_penalty == pytest.approx([-0.25, -0.5])
    off = score_rollout(
        PROMPTS,
        _rollout(tokenizer),
        tokenizer,
        build_config({}, [*OVERRIDES, "reward_model.overlong_buffer.enable=false"]),
    )
    assert [g.overlong_penalty for g in off] == [[0.0, 0.0], [0.0, 0.0]]
    assert [g.rewards for g in off] == [[1.0, -1.0], [1.0, -1.0]]  # the rule reward alone


def test_overlong_buffer_as_long_as_l_max(tokenizer) -> None:  # type: ignore[no-untyped-def]
    # L_cache = L_max = 20: the penalty starts at the first token: -len / 20.
    cfg = build_config({}, ["data.max_response_length=20", "reward_model.overlong_buffer.len=20"])
    groups = score_rollout(PROMPTS, _rollout(tokenizer), tokenizer, cfg)
    assert groups[0].overlong_penalty == pytest.approx([-15 / 20, -1.0])
    assert groups[1].overlong_penalty == pytest.approx([-8 / 20, -10 / 20])


def test_custom_reward_function_gets_the_prompt_fields(
    tokenizer,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    fn_file = tmp_path / "my_reward.py"
    fn_file.write_text(
        textwrap.dedent("""
        def judge(data_source, solution_str, ground_truth, extra_info=None):
            right = solution_str.endswith(ground_truth)
            note = (extra_info or {}).get("note", "-")
            return {"score": 0.25 if right else -0.75, "acc": right, "pred": f"{data_source}|{note}"}
    """)
    )
    cfg = build_config({}, [*OVERRIDES, f"custom_reward_function.path={fn_file}", "custom_reward_function.name=judge"])
    g0, g1 = score_rollout(PROMPTS, _rollout(tokenizer), tokenizer, cfg)
    assert g0.scores == [0.25, -0.75] and g0.acc == [True, False]
    assert g0.preds == ["math_dapo|-", "math_dapo|-"]
    assert g1.scores == [0.25, -0.75]
    assert g1.preds == ["synth_val|kept for scorers"] * 2  # extra_info of the prompt reached the function
    assert g0.rewards == pytest.approx([0.25 - 0.5, -0.75 - 1.0])  # the penalty is added to custom scores too


def test_empty_rollout_gives_no_groups(tokenizer) -> None:  # type: ignore[no-untyped-def]
    empty = RolloutOutput(prompt_index=[], response_ids=[], logprobs=[], finish_reason=[])
    assert score_rollout(PROMPTS, empty, tokenizer, DapoConfig()) == []


# ---- ScoredGroup ---------------------------------------------------------------------------------------------------


def _group() -> ScoredGroup:
    return ScoredGroup(
        prompt=PromptItem(7, (1, 2, 3), "12", "math_dapo", {"split": "train"}),
        response_ids=[[4, 5], [6], [7, 8, 9]],
        rollout_log_probs=[[-0.5, -0.25], [-1.0], [-0.125, -2.0, -3.5]],
        truncated=[False, False, True],
        scores=[1.0, -1.0, -1.0],
        acc=[True, False, False],
        overlong_penalty=[0.0, -0.25, -1.0],
        preds=["12", "11", ""],
    )


def test_rewards_are_score_plus_penalty_and_tokens_are_counted() -> None:
    g = _group()
    assert g.rewards == [1.0, -1.25, -2.0]
    assert g.num_response_tokens == 6


def test_state_round_trips_through_json() -> None:
    g = _group()
    state = json.loads(json.dumps(g.to_state()))  # JSON-able, as a checkpoint stores it
    restored = ScoredGroup.from_state(state)
    assert restored == g
    assert restored.prompt.input_ids == (1, 2, 3) and isinstance(restored.prompt.input_ids, tuple)
    assert restored.rewards == g.rewards and restored.num_response_tokens == g.num_response_tokens
    assert ScoredGroup.from_state(restored.to_state()).to_state() == g.to_state()


def test_state_keeps_the_prompts_extra_info() -> None:
    g = _group()
    g = ScoredGroup(
        PromptItem(7, (1, 2), "3", "math_dapo", {"index": 4, "split": "train"}),
        *[
            getattr(g, f)
            for f in ("response_ids", "rollout_log_probs", "truncated", "scores", "acc", "overlong_penalty", "preds")
        ],
    )
    restored = ScoredGroup.from_state(json.loads(json.dumps(g.to_state())))
    assert restored.prompt.extra_info == {"index": 4, "split": "train"}


def _sized(n: int) -> ScoredGroup:
    return ScoredGroup(
        PromptItem(n, (1,), "1", "math_dapo"),
        [[2]] * n,
        [[-1.0]] * n,
        [False] * n,
        [1.0] * n,
        [True] * n,
        [0.0] * n,
        ["1"] * n,
    )


def test_group_index_of_lays_groups_out_one_after_another() -> None:
    index = group_index_of([_sized(3), _sized(1), _sized(2)])
    assert index.dtype == torch.long
    assert index.tolist() == [0, 0, 0, 1, 2, 2]
    empty = group_index_of([])
    assert empty.dtype == torch.long and empty.tolist() == []


def _trajectory(tokenizer, model_before: str, tool: str, model_after: str):  # type: ignore[no-untyped-def]
    """A multi-turn trajectory: model tokens, a tool output (mask 0), model tokens, EOS."""
    from dapo.rollout.multi_turn import MultiTurnOutput

    before, out = (tokenizer.encode(t, add_special_tokens=False) for t in (model_before, tool))
    after = tokenizer.encode(model_after, add_special_tokens=False) + [tokenizer.eos_token_id]
    ids = before + out + after
    mask = [1] * len(before) + [0] * len(out) + [1] * len(after)
    return ids, mask, MultiTurnOutput


def test_an_answer_line_printed_by_the_tool_earns_no_reward(tokenizer) -> None:  # type: ignore[no-untyped-def]
    # #39 item 8: the reward read the whole trajectory, so code that printed "Answer: 42" scored +1 for a model that
    # wrote no answer at all. Only the model's tokens are scored: the same tool output, the answer written by the
    # model after it, is right; printed by the tool alone, it is wrong.
    forged = _trajectory(tokenizer, "```python\nprint('Answer: 42')\n```", "\n```output\nAnswer: 42\n```\n", "ok")
    honest = _trajectory(tokenizer, "```python\nprint(6 * 7)\n```", "\n```output\n42\n```\n", "Answer: 42")
    cls = forged[2]
    rollout = cls(
        prompt_index=[0, 0],
        response_ids=[forged[0], honest[0]],
        logprobs=[[0.0] * len(forged[0]), [0.0] * len(honest[0])],
        finish_reason=["stop", "stop"],
        action_mask=[forged[1], honest[1]],
        turns=[2, 2],
        tool_categories=[["ok"], ["ok"]],
    )
    [group] = score_rollout(PROMPTS, rollout, tokenizer, build_config({}, ["data.max_response_length=200"]))
    assert group.acc == [False, True] and group.scores == [-1.0, 1.0]
    assert group.action_masks == [forged[1], honest[1]]


def test_model_text_joins_the_models_runs_and_leaves_the_tool_out(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from dapo.rollout.multi_turn import model_text

    ids, mask, _ = _trajectory(tokenizer, "a=1", "TOOL", "b")
    assert model_text(tokenizer, ids, mask) == "a=1\nb"  # EOS skipped, the tool segment one newline
    with pytest.raises(ValueError, match="3 ids but 2 mask entries"):
        model_text(tokenizer, ids[:3], mask[:2])
