"""Compute-aware dynamic sampling end to end: ``train/wasted_tokens`` against hand-counted tokens of a scripted case,
the skipped-solved-prompt counts, and a run with the pass-rate record and carried surplus resuming bit-identically."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dapo.config import ConfigError, build_config
from dapo.core.dynamic_sampling import filter_informative_groups
from dapo.data.prompt_sampler import PromptSampler
from dapo.data.prompts import PromptItem
from dapo.infra.timing import PhaseTimer
from dapo.training.dynamic_sampling_buffer import DynamicSamplingBuffer
from dapo.training.generation import generate_and_filter
from dapo.training.run_state import RunState
from dapo.training.staleness import stamp_versions
from tests.cli.cli_helpers import FAST
from tests.harness.engines import ScriptedEngine
from tests.harness.tokenizers import CharTokenizer

# Per prompt uid: its ground truth and the G=2 responses the engine gives every time (a character is a token).
SCRIPT: dict[int, tuple[str, tuple[str, str]]] = {
    0: ("1", ("Answer: 1", "xAnswer: 1")),  # all correct (9 + 10 tokens)
    1: ("2", ("Answer: 2", "Answer: 5")),  # mixed
    2: ("3", ("Answer: 7", "yyAnswer: 8")),  # all wrong (9 + 11)
    3: ("4", ("Answer: 4", "zzzAnswer: 6")),  # mixed
    4: ("5", ("Answer: 5", "Answer: 9 ......")),  # mixed, beyond the batch: discarded surplus (9 + 16)
    5: ("6", ("wAnswer: 6", "wwwwAnswer: 6")),  # all correct (10 + 13)
}


def scripted_engine() -> ScriptedEngine:
    """Every prompt ``uid`` gets SCRIPT's G responses for it, each time."""
    return ScriptedEngine(
        lambda prompts, params: [
            CharTokenizer().encode(text) for prompt in prompts for text in SCRIPT[prompt[0]][1][: params.n]
        ]
    )


def _tokens(uid: int) -> int:
    return sum(len(t) for t in SCRIPT[uid][1])


def test_pass_rate_per_group_by_hand() -> None:
    acc = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0, 0, 0])
    group = torch.tensor([7, 7, 3, 3, 3, 3, 5, 5, 5, 5])
    assert filter_informative_groups(acc, group).pass_rate.tolist() == [0.25, 0.25, 1.0]  # groups 3, 5, 7


def test_skip_solved_prompts_config_is_off_by_default_and_checked() -> None:
    skip = build_config().algorithm.filter_groups.skip_solved_prompts
    assert (skip.enable, skip.epochs) == (False, 1)
    with pytest.raises(ConfigError, match="skip_solved_prompts.epochs"):
        build_config(overrides=["algorithm.filter_groups.skip_solved_prompts.epochs=0"])


def test_wasted_tokens_are_the_hand_counted_tokens_of_dropped_and_discarded_groups() -> None:
    cfg = build_config(
        overrides=[
            "data.train_batch_size=2",
            "data.gen_batch_size=3",
            "rollout.n=2",
            "actor.ppo_mini_batch_size=1",
            "data.shuffle=false",
            "algorithm.filter_groups.max_num_gen_batches=2",
            "algorithm.filter_groups.skip_solved_prompts.enable=true",
        ]
    )
    items = [PromptItem(uid, (uid, 99), SCRIPT[uid][0], "synth") for uid in SCRIPT]
    state = RunState(PromptSampler.from_config(items, cfg), DynamicSamplingBuffer.from_config(cfg))
    engine, tok = scripted_engine(), CharTokenizer()

    # Step 1, epoch 0: round 0 draws uids 0 1 2 (1 kept), round 1 draws 3 4 5 (3 and 4 kept): the batch is 1, 3.
    kept, m = generate_and_filter(engine, state, tok, cfg, 1, PhaseTimer("gen", "reward"))
    assert [g.prompt.uid for g in kept] == [1, 3]
    dropped, discarded = _tokens(0) + _tokens(2) + _tokens(5), _tokens(4)
    assert (dropped, discarded) == (19 + 20 + 23, 25)
    assert m["train/wasted_tokens"] == dropped + discarded == 87
    assert m["train/generated_tokens"] == sum(_tokens(u) for u in SCRIPT) == m["rollout/num_tokens"]
    assert m["train/num_discarded_surplus_groups"] == 1
    assert m["train/num_skipped_solved_prompts"] == 0
    assert [h for u in SCRIPT for h in state.sampler.record.history(u)] == [
        (0, 1.0),
        (0, 0.5),
        (0, 0.0),
        (0, 0.5),
        (0, 0.5),
        (0, 1.0),
    ]

    # Step 2, epoch 1: uid 0 (solved by every sample) is skipped, 1 2 3 are drawn; 2 is dropped again, nothing left.
    kept, m2 = generate_and_filter(engine, state, tok, cfg, 2, PhaseTimer("gen", "reward"))
    assert [g.prompt.uid for g in kept] == [1, 3]
    assert m2["train/num_skipped_solved_prompts"] == 1 and m2["train/num_skipped_solved_prompts_total"] == 1
    assert m2["train/wasted_tokens"] == _tokens(2) == 20
    assert m2["train/generated_tokens"] == _tokens(1) + _tokens(2) + _tokens(3)
    assert m2["train/wasted_tokens_total"] == 87 + 20 == state.wasted_tokens_total
    assert m2["train/generated_tokens_total"] == m["train/generated_tokens"] + m2["train/generated_tokens"]
    restored = RunState(PromptSampler.from_config(items, cfg), DynamicSamplingBuffer.from_config(cfg))
    restored.load_state_dict(json.loads(json.dumps(state.state_dict())))
    assert restored.state_dict() == state.state_dict()


def _carrying(*overrides: str) -> tuple:
    """The config and a fresh run state of the carried-surplus cases: 3 prompts a round, batches of 2."""
    cfg = build_config(
        overrides=[
            "data.train_batch_size=2",
            "data.gen_batch_size=3",
            "rollout.n=2",
            "actor.ppo_mini_batch_size=1",
            "data.shuffle=false",
            "algorithm.filter_groups.max_num_gen_batches=2",
            "algorithm.filter_groups.carry_over_surplus=true",
            "algorithm.filter_groups.skip_solved_prompts.enable=true",
            *overrides,
        ]
    )
    items = [PromptItem(uid, (uid, 99), SCRIPT[uid][0], "synth") for uid in SCRIPT]
    return cfg, RunState(PromptSampler.from_config(items, cfg), DynamicSamplingBuffer.from_config(cfg))


def test_carried_surplus_is_not_wasted() -> None:
    cfg, state = _carrying()
    _, m = generate_and_filter(scripted_engine(), state, CharTokenizer(), cfg, 1, PhaseTimer("gen", "reward"))
    assert m["train/wasted_tokens"] == _tokens(0) + _tokens(2) + _tokens(5)  # uid 4 is carried, not wasted
    assert m["train/num_discarded_surplus_groups"] == 0 and state.buffer.num_groups == 1
    # Step 2 starts with uid 4; epoch 1 skips 0 and draws 1 2 3 (1 kept: the batch is 4, 1; 3 is carried again).
    kept, m2 = generate_and_filter(scripted_engine(), state, CharTokenizer(), cfg, 2, PhaseTimer("gen", "reward"))
    assert [g.prompt.uid for g in kept] == [4, 1]
    assert m2["train/num_skipped_solved_prompts"] == 1 and m2["train/wasted_tokens"] == _tokens(2)
    assert state.sampler.record.history(4) == [(0, 0.5)]  # recorded once, when generated


@pytest.mark.parametrize("oldest_version", [0, 1])
def test_a_carried_group_older_than_an_async_batch_allows_is_dropped_and_refilled(oldest_version: int) -> None:
    """An asynchronous batch (``oldest_version``: what its staleness bound allows) drops the carried groups whose
    oldest token is older and refills: uid 4, carried from step 1 with version 0, trains in step 2's batch only if
    version 0 is allowed; otherwise the round that draws 1 2 3 keeps 1 and 3, and uid 4's tokens are wasted."""
    cfg, state = _carrying("async_training.mode=fully_async")
    generate_and_filter(
        scripted_engine(),
        state,
        CharTokenizer(),
        cfg,
        1,
        PhaseTimer("gen", "reward"),
        on_round=lambda groups: stamp_versions(groups, 0),
        oldest_version=0,
    )
    assert [g.prompt.uid for g in state.buffer.state_dict()["groups"]] == [4]  # carried, with version 0
    kept, m = generate_and_filter(
        scripted_engine(), state, CharTokenizer(), cfg, 2, PhaseTimer("gen", "reward"), oldest_version=oldest_version
    )
    if oldest_version == 0:  # within the bound: trained as in the synchronous loop
        assert [g.prompt.uid for g in kept] == [4, 1] and m["async/stale_dropped_groups"] == 0
        assert m["train/wasted_tokens"] == _tokens(2)
    else:
        assert [g.prompt.uid for g in kept] == [1, 3] and m["async/stale_dropped_groups"] == 1
        assert m["train/wasted_tokens"] == _tokens(2) + _tokens(4) and state.buffer.num_groups == 0


# ---------------------------------------------------------------------------------------------- resume
# The tiny model on a small, easy synthetic set at a low temperature, so that prompts come out all-correct, recur
# (8 prompts, 6 per round) and are skipped; surplus groups are carried over between steps.
RESUME_ARGS = [a for a in FAST if not a.startswith(("trainer.total_training_steps", "trainer.test_freq"))] + [
    "data.synth.num_train=8",
    "data.synth.min_operands=2",
    "data.synth.max_operands=2",
    "data.synth.max_value=3",
    "rollout.temperature=0.3",
    "rollout.n=2",
    "data.gen_batch_size=6",
    "algorithm.filter_groups.max_num_gen_batches=3",
    "algorithm.filter_groups.carry_over_surplus=true",
    "algorithm.filter_groups.skip_solved_prompts.enable=true",
    "trainer.save_freq=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.progress=false",
    "trainer.logger=[jsonl]",
]
STEPS = 4


def _train(root, name: str, steps: int):
    from dapo.training.loop import train

    return train(
        build_config(
            overrides=[
                *RESUME_ARGS,
                f"trainer.total_training_steps={steps}",
                f"trainer.experiment_name={name}",
                f"trainer.default_local_dir={root}",
            ]
        )
    )


def _learning_metrics(run_dir) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        r["step"]: {k: v for k, v in r.items() if k.startswith(("train/", "critic/", "acc/", "rollout/acc"))}
        for r in rows
    }


def test_a_run_with_the_record_resumes_bit_identically(tmp_path) -> None:
    """Like tests/cli/test_resume.py, in process: stop after step 2's checkpoint, resume to step 4, compare with an
    uninterrupted run: weights, the record, the skip counts and the token totals."""
    straight = _train(tmp_path, "straight", STEPS)
    _train(tmp_path, "resumed", 2)
    resumed = _train(tmp_path, "resumed", STEPS)
    assert resumed.steps_run == STEPS - 2
    final = "checkpoints/global_step_4"
    a = load_file(straight.run_dir / final / "hf" / "model.safetensors")
    b = load_file(resumed.run_dir / final / "hf" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state_a = json.loads((straight.run_dir / final / "trainer_state.json").read_text())
    state_b = json.loads((resumed.run_dir / final / "trainer_state.json").read_text())
    assert state_a == state_b
    assert any(state_a["sampler"]["pass_rates"])  # the record was written
    ma, mb = _learning_metrics(straight.run_dir), _learning_metrics(resumed.run_dir)
    assert ma == mb
    assert ma[STEPS]["train/num_skipped_solved_prompts_total"] > 0  # the run did skip solved prompts
