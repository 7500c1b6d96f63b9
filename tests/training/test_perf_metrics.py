"""Per-step efficiency metrics: the actor's count by hand (trained samples only), and the checks of the perf/* keys
that tests/cli/test_train_cli.py applies to its real 2-step `dapo train` run."""

from __future__ import annotations

import pytest

from dapo.config import load_config
from dapo.data.prompts import PromptItem
from dapo.infra.perf import PeakFlops, group_forward_flops
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.perf_metrics import StepPerf
from tests.infra.test_perf import Shape


def group(prompt_len: int, lengths: list[int], acc: list[bool]) -> ScoredGroup:
    k = len(lengths)
    return ScoredGroup(
        PromptItem(0, tuple(range(prompt_len)), "1", "s"),
        [[5] * n for n in lengths],
        [[-1.0] * n for n in lengths],
        [False] * k,
        [1.0 if a else -1.0 for a in acc],
        acc,
        [0.0] * k,
        ["1"] * k,
    )


def perf_of(*overrides: str) -> StepPerf:
    peak = PeakFlops(1e9, "fp32", "test")
    return StepPerf(Shape(), load_config(None, list(overrides)), actor_peak=peak, rollout_peak=peak)


def test_actor_counts_trained_samples_forward_and_backward() -> None:
    mixed = group(3, [2, 1], [True, False])
    solved = group(4, [3, 3], [True, True])  # zero advantages: the update skips it, and so does the count
    flops, tokens = perf_of().actor_flops([mixed, solved], recomputed=False)
    assert flops == 3 * group_forward_flops(Shape(), 3, [2, 1]) == 3 * 16000
    assert tokens == (3 + 2) + (3 + 1)
    # two PPO epochs, and pi_old recomputed: a forward over every sample of the batch on top
    flops, tokens = perf_of("actor.ppo_epochs=2").actor_flops([mixed, solved], recomputed=True)
    assert flops == 2 * 3 * 16000 + 16000 + group_forward_flops(Shape(), 4, [3, 3])
    assert tokens == 2 * 9


def test_step_metrics_from_counts_and_seconds() -> None:
    perf = perf_of()
    mixed = group(3, [2, 1], [True, False])
    perf.count_generated([mixed, group(4, [3, 3], [True, True])])  # a dropped group costs generation too
    m = perf.metrics([mixed], {"gen": 2.0, "update_actor": 4.0, "old_log_prob": 0.0}, recomputed=False)
    gen = 16000 + group_forward_flops(Shape(), 4, [3, 3])
    assert m["perf/flops/rollout"] == gen and m["perf/flops_per_s/rollout"] == gen / 2.0
    assert m["perf/mfu/rollout"] == gen / 2.0 / 1e9
    assert m["perf/tokens_per_s/rollout"] == (2 + 1 + 3 + 3) / 2.0
    assert m["perf/flops/actor"] == 48000 and m["perf/mfu/actor"] == 48000 / 4.0 / 1e9
    assert m["perf/tokens_per_s/actor"] == 9 / 4.0
    # the count starts again for the next step; a step without an update reports generation only
    perf.count_generated([mixed])
    m = perf.metrics([], {"gen": 1.0}, recomputed=False)
    assert m["perf/flops/rollout"] == 16000 and "perf/mfu/actor" not in m


def check_perf_metrics(r: dict) -> None:
    """The perf/* keys of one step record of a real `dapo train` run (called on tests/cli/test_train_cli.py's 2-step
    run, so no extra run is spent here): consistent with the run's own token counts and phase timings."""
    # generation's token count is the loop's own (every round, kept or dropped)
    assert r["perf/tokens_per_s/rollout"] * r["timing_s/gen"] == pytest.approx(r["rollout/num_tokens"])
    for phase, seconds in (
        ("rollout", r["timing_s/gen"]),
        ("actor", r["timing_s/update_actor"] + r["timing_s/old_log_prob"]),
    ):
        assert r[f"perf/flops_per_s/{phase}"] * seconds == pytest.approx(r[f"perf/flops/{phase}"])
        assert r[f"perf/mfu/{phase}"] == pytest.approx(
            min(1.0, r[f"perf/flops_per_s/{phase}"] / r[f"perf/peak_flops/{phase}"])
        )  # a peak probed under load: 1
        assert 0 < r[f"perf/mfu/{phase}"] <= 1
    # at least 2 N per generated token of the 1,059,968-weight model; training at least 6 N per token of each kept
    # group's prompt and one response (every kept group is informative, so it is trained)
    assert r["perf/flops/rollout"] >= 2 * 1_059_968 * r["rollout/num_tokens"]
    assert r["perf/flops/actor"] >= 6 * 1_059_968 * r["train/num_groups"] * (
        r["prompt_length/min"] + r["response_length/min"]
    )
