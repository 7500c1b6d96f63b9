"""Asynchronous training with the engine in a rollout worker process: the staleness bound holds on every sample, the
actor recomputes pi_old for stale samples, the weights travel over the process group, dynamic sampling (Eq. 11 and the
refill buffer) runs on the stream of finished groups, a one-step-off run resumed from its step-2 checkpoint ends as
exactly the uninterrupted run (the batch generated ahead is saved with the checkpoint), and a fully-async run killed
with SIGKILL loses no step.

Every run here writes its trained batches (``trainer.rollout_data_dir``), so what the update saw is read back sample
by sample, not inferred from averages. Dynamic sampling is made to bite: 6 prompts per round for a batch of 4
groups, at most 3 rounds, on a task where the untrained model gets many groups all wrong.

Every run is a real `dapo train` process forked from the warm server (tests/harness/runners.py: no ~8 s of imports per
start); its rollout worker is spawned by the run itself, as in any `dapo train`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dapo.config import build_config
from dapo.training.staleness import ProducedBatch, sample_lags, staleness_metrics
from tests.cli.cli_helpers import FAST
from tests.training.test_perf_metrics import group
from tests.harness.resume import assert_resumed_from_step_2_ends_as, records_of, run_straight, trained_batches_of
from tests.harness.runners import kill_after_checkpoint, run_dapo_warm

GEN_BATCH, MAX_ROUNDS, GROUPS, N = 6, 3, 4, 4  # data.gen_batch_size, max_num_gen_batches, train_batch_size, rollout.n
ASYNC = [
    *FAST,
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "data.max_response_length=24",
    "async_training.mode=one_step_off",
    "async_training.rollout_num_threads=1",
    f"data.gen_batch_size={GEN_BATCH}",
    f"algorithm.filter_groups.max_num_gen_batches={MAX_ROUNDS}",
]
assert f"data.train_batch_size={GROUPS}" in FAST and f"rollout.n={N}" in FAST


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_straight(ASYNC, tmp_path_factory.mktemp("async"), "straight")


def test_no_sample_is_older_than_one_version(straight: Path) -> None:
    records = [r for r in records_of(straight) if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        lag_keys = {k for k in r if k.startswith("async/staleness/samples_lag_")}
        total = sum(r[k] for k in lag_keys)
        assert total > 0 and total % 4 == 0  # whole groups of rollout.n=4 samples, each counted once
        # every sample of the batch is counted under its lag, and none lags more than one version
        assert all(int(k.rsplit("_", 1)[1]) <= 1 for k in lag_keys), r
        assert r["async/staleness/max"] <= 1
    assert records[0]["async/staleness/max"] == 0  # step 1 trains on the initial weights' samples
    assert all(r["async/staleness/mean"] == 1 and r["async/staleness/max"] == 1 for r in records[1:])
    assert all(r["async/partial_fraction"] == 0 for r in records)


def test_stale_samples_get_pi_old_from_the_actor_and_the_weights_travel(straight: Path) -> None:
    records = [r for r in records_of(straight) if r["step"] > 0]
    assert all(r["actor/old_log_prob_recomputed"] == 1.0 for r in records)
    assert all(r["async/weight_transfer_bytes"] > 1e6 for r in records)  # the tiny model, fp32: ~4 MB
    assert all(r["rollout/probe_logprob_diff"] < 1e-3 for r in records)  # the worker holds the pushed weights
    assert all(r["async/trainer_idle_s"] >= 0 and r["async/overlap_s"] >= 0 for r in records)


def test_a_run_resumed_from_its_step_2_checkpoint_ends_as_the_uninterrupted_run(straight: Path, tmp_path: Path) -> None:
    assert_resumed_from_step_2_ends_as(straight, ASYNC, tmp_path)


# The calculator's multi-turn rollouts (configs/tools/tiny_calculator.yaml) under one_step_off: the batch saved ahead
# holds trajectories (model and tool tokens, action masks, per-token versions), which must come back exactly.
TOOLS_STEPS = 3  # step 3 trains the batch saved ahead at step 2's checkpoint: all the resume has to show
TOOLS = [
    "--config",
    str(Path(__file__).resolve().parents[2] / "configs" / "tools" / "tiny_calculator.yaml"),
    *[
        a
        for a in ASYNC
        if not a.startswith(("data.max_response_length", "trainer.total_training_steps", "data.gen_batch_size"))
    ],
    "data.max_response_length=64",  # room for a tool call or two (the config's 96 is a longer trajectory budget)
    "algorithm.filter_groups.enable=false",  # one generation round a step: the refill is the other tests' subject
    f"trainer.total_training_steps={TOOLS_STEPS}",
]


def test_a_multi_turn_run_resumed_from_its_step_2_checkpoint_ends_as_the_uninterrupted_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("tools")
    straight = run_straight(TOOLS, root, "tools")
    # the tool really ran in every step's batch, step 3's (the one saved ahead) included
    assert [r["step"] for r in records_of(straight)] == list(range(1, TOOLS_STEPS + 1))
    assert all(r["tool/calls"] > 0 for r in records_of(straight)), records_of(straight)
    assert_resumed_from_step_2_ends_as(straight, TOOLS, root / "resumed", last=TOOLS_STEPS)


# Killed after step 2's checkpoint, resumed for steps 3 and 4: with staleness_threshold=1 at most batch 3 can be
# complete at that checkpoint (batch 4 needs version 2, pushed just before it), so step 4 is always generated anew by
# the resumed worker and step 3 is either a saved batch or a new one -- every case the tests read.
FULLY_STEPS = 4
FULLY_ASYNC = [a for a in ASYNC if not a.startswith(("async_training.mode", "trainer.save_freq"))] + [
    "async_training.mode=fully_async",
    "async_training.staleness_threshold=1",
    "async_training.partial_rollout=true",
    "async_training.partial_rollout_chunk_tokens=4",
    f"trainer.total_training_steps={FULLY_STEPS}",
    "trainer.save_freq=2",
]
OPTIMIZER_STEPS_PER_STEP = 2  # train_batch_size 4 / ppo_mini_batch_size 2, one epoch
assert "actor.ppo_mini_batch_size=2" in FAST


@dataclasses.dataclass
class KilledRun:
    """A fully asynchronous run killed with SIGKILL right after its step-2 checkpoint, then resumed to the end; what
    was on disk at the kill is kept to compare with."""

    run_dir: Path
    records_at_kill: list[str]  # metrics.jsonl's lines
    batches_at_kill: dict[str, str]  # the trained batches' files
    saved_state: dict  # the run state of the step-2 checkpoint


@pytest.fixture(scope="module")
def fully_killed(tmp_path_factory: pytest.TempPathFactory) -> KilledRun:
    """One run serves every fully asynchronous test: its resumed half must satisfy all they check."""
    root = tmp_path_factory.mktemp("fully")
    run_dir = root / "fully"
    args = [
        "train",
        *FULLY_ASYNC,
        "trainer.experiment_name=fully",
        f"trainer.rollout_data_dir={run_dir / 'batches'}",
        f"trainer.default_local_dir={root}",
    ]
    kill_after_checkpoint(args, run_dir / "checkpoints" / "global_step_2")
    checkpoint = run_dir / "checkpoints" / "global_step_2"
    saved = json.loads((checkpoint / "trainer_state.json").read_text())
    if (checkpoint / "trainer_state.pt").exists():  # the part of the state JSON cannot hold exactly
        saved.update(torch.load(checkpoint / "trainer_state.pt", weights_only=True))
    killed = KilledRun(
        run_dir,
        (run_dir / "metrics.jsonl").read_text().splitlines(),
        {p.name: p.read_text() for p in (run_dir / "batches").glob("*.jsonl")},
        saved,
    )
    resumed = run_dapo_warm(args[:-1], root, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return killed


@pytest.fixture(scope="module")
def fully(fully_killed: KilledRun) -> Path:
    return fully_killed.run_dir


def test_fully_async_with_partial_rollouts_never_trains_a_sample_older_than_the_threshold(fully: Path) -> None:
    records = [r for r in records_of(fully) if r["step"] > 0]
    assert [r["step"] for r in records] == list(range(1, FULLY_STEPS + 1))
    for r in records:
        lags = {int(k.rsplit("_", 1)[1]): v for k, v in r.items() if k.startswith("async/staleness/samples_lag_")}
        assert sum(lags.values()) > 0 and max(lags) <= 1, r  # every sample counted, none older than 1 version
        assert r["async/staleness/max"] <= 1 and 0 <= r["async/partial_fraction"] <= 1
        assert r["actor/old_log_prob_recomputed"] == 1.0
    assert records[0]["async/staleness/max"] == 0
    for step, lines in trained_batches_of(fully).items():  # sample by sample, from the batches as trained
        for line in lines:
            assert line["lag"] == step - 1 - min(line["weight_versions"]) <= 1, (step, line)
            assert len(line["weight_versions"]) > 0 and max(line["weight_versions"]) <= step - 1


def test_fully_async_killed_with_sigkill_loses_no_step_and_trains_the_saved_batches_first(
    fully_killed: KilledRun,
) -> None:
    """What a fully asynchronous resume guarantees (docs/async.md, Checkpoints). It is not the uninterrupted run bit
    for bit: which weights a batch is drawn from, and where a partial rollout's segments meet a push, depend on how
    the two processes interleave."""
    run_dir, saved = fully_killed.run_dir, fully_killed.saved_state
    assert saved["step"] == 2
    # Nothing completed before the checkpoint is lost or redone: its records and trained batches stay as they were.
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    kept = [line for line in fully_killed.records_at_kill if json.loads(line)["step"] <= 2]
    assert lines[: len(kept)] == kept and [json.loads(line)["step"] for line in kept] == [1, 2]
    # the resumed run finished every step
    assert [json.loads(line)["step"] for line in lines] == list(range(1, FULLY_STEPS + 1))
    for name in ("1.jsonl", "2.jsonl"):
        assert (run_dir / "batches" / name).read_text() == fully_killed.batches_at_kill[name]
    # Every optimizer step ran exactly once across the kill: AdamW counts them per parameter.
    optimizer = torch.load(run_dir / "checkpoints" / f"global_step_{FULLY_STEPS}" / "optimizer.pt", weights_only=True)
    assert {float(s["step"]) for s in optimizer["state"].values()} == {FULLY_STEPS * OPTIMIZER_STEPS_PER_STEP}
    # The batches complete at the checkpoint train next, exactly as saved (samples, rewards, versions) ... (with
    # staleness_threshold=1 batch 3 is rarely complete at step 2's checkpoint on 2 busy cores: it starts after push 1
    # and must beat step 2's update; one_step_off's kill test above covers a saved batch bit for bit)
    batches = trained_batches_of(run_dir)
    prefetched = saved.get("prefetched", [])
    for i, batch in enumerate(prefetched):
        trained = [(line["uid"], line["acc"], line["score"], line["weight_versions"]) for line in batches[3 + i]]
        assert trained == [
            (g["prompt"]["uid"], a, score, versions)
            for g in batch["groups"]
            for a, score, versions in zip(g["acc"], g["scores"], g["token_versions"], strict=True)
        ]
    # ... and every later batch is generated anew by the resumed worker (which starts from the checkpoint's
    # weights, version 2): a generation in flight at the kill is dropped, never half-carried over.
    assert 3 + len(prefetched) <= FULLY_STEPS, len(prefetched)  # at least one batch generated after the resume
    for step in range(3 + len(prefetched), FULLY_STEPS + 1):
        assert min(v for line in batches[step] for v in line["weight_versions"]) >= 2, step


def test_fully_async_at_staleness_zero_ends_with_the_sync_loops_weights_bit_for_bit(tmp_path: Path) -> None:
    """The on-policy limit of fully async (#34; verl-project/verl#6780): with staleness_threshold=0 the producer may
    not draw a batch from weights older than the actor's, so every batch is generated by the weights that train on
    it, as in the sync loop. Same seeds, one torch thread on each side (the reduction order of a matrix product
    depends on the thread count), pi_old recomputed by the actor in both: the final weights are equal bit for bit, and
    so is every trained batch. An async run that let one sample lag, or a worker that sampled with other weights or
    other seeds, ends elsewhere."""
    base = [
        a
        for a in ASYNC
        if not a.startswith(("async_training.mode", "trainer.total_training_steps", "trainer.save_freq"))
    ]
    base += [
        "trainer.total_training_steps=3",
        "trainer.save_freq=3",
        "trainer.num_threads=1",
        "actor.recompute_old_log_prob=always",
    ]
    runs = {
        "sync": ["async_training.mode=sync"],
        "async0": ["async_training.mode=fully_async", "async_training.staleness_threshold=0"],
    }
    for name, mode in runs.items():
        result = run_dapo_warm(
            [
                "train",
                *base,
                *mode,
                f"trainer.experiment_name={name}",
                f"trainer.rollout_data_dir={tmp_path / name / 'batches'}",
            ],
            tmp_path,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    async_records = [r for r in records_of(tmp_path / "async0") if r["step"] > 0]
    assert [r["async/staleness/max"] for r in async_records] == [0, 0, 0]
    a = load_file(tmp_path / "sync" / "checkpoints" / "global_step_3" / "hf" / "model.safetensors")
    b = load_file(tmp_path / "async0" / "checkpoints" / "global_step_3" / "hf" / "model.safetensors")
    assert a.keys() == b.keys()
    assert max((a[n].double() - b[n].double()).abs().max().item() for n in a) == 0.0
    drop = ("weight_versions", "lag")  # async-only bookkeeping fields
    assert {
        k: [{f: v for f, v in line.items() if f not in drop} for line in lines]
        for k, lines in trained_batches_of(tmp_path / "sync").items()
    } == {
        k: [{f: v for f, v in line.items() if f not in drop} for line in lines]
        for k, lines in trained_batches_of(tmp_path / "async0").items()
    }


@pytest.mark.parametrize("run", ["straight", "fully"])
def test_dynamic_sampling_fills_every_async_batch_with_informative_groups_only(
    run: str, request: pytest.FixtureRequest
) -> None:
    """Eq. 11 and the refill buffer run on the stream of finished groups in both asynchronous modes: every group
    that trains has both right and wrong answers, every batch holds train_batch_size groups, and no batch took more
    than max_num_gen_batches rounds; every generated group is accounted for (trained, dropped by Eq. 11, or surplus
    discarded)."""
    run_dir = request.getfixturevalue(run)
    records = [r for r in records_of(run_dir) if r["step"] > 0]
    batches = trained_batches_of(run_dir)
    assert sorted(batches) == [r["step"] for r in records]
    dropped = 0
    for r in records:
        lines = batches[r["step"]]
        groups: dict[int, list[bool]] = {}
        for line in lines:
            groups.setdefault(line["group"], []).append(line["acc"])
        assert len(groups) == GROUPS and all(len(accs) == N for accs in groups.values()), r["step"]
        assert all(0 < sum(accs) < N for accs in groups.values()), (r["step"], groups)  # Eq. 11 on every group
        assert r["train/num_groups"] == GROUPS and r["train/partial_batch"] == 0
        rounds = r["train/num_gen_batches"]
        assert 1 <= rounds <= MAX_ROUNDS  # over-generation is bounded
        dropped_now = r["train/num_all_correct_groups"] + r["train/num_all_wrong_groups"]
        assert rounds * GEN_BATCH == GROUPS + dropped_now + r["train/num_discarded_surplus_groups"]
        dropped += dropped_now
    assert dropped > 0  # the filter had something to drop: the test is not vacuous


# trigger_parameter_sync_step=2 with carry_over_surplus, 4 steps: pushes after steps 2 and 4 only, so the engine holds
# version 0, then 2. fully_async at staleness_threshold=0 (in pushes) draws batches 1-2 from version 0 and 3-4 from
# version 2 (batch 3 waits for push 2): lags 0 1 0 1, bound (0+1)*2-1 = 1. one_step_off draws batch j while step j-1
# trains, from the last push before it: versions 0 0 0 2, lags 0 1 2 1, bound 2. Either way one batch would train a
# carried group past its bound (fully_async: batch 2's surplus, version 0, in batch 3; one_step_off: batch 3's in
# batch 4): those are dropped and refilled. Without partial rollouts which weights draw a batch is fixed by the
# schedule, not by timing, and the per-round seeds fix what is drawn, so every count below is the same on every run.
EVERY_K = {
    "fully_async": (["async_training.staleness_threshold=0"], [0, 0, 2, 2], 1, 3),
    "one_step_off": ([], [0, 0, 0, 2], 2, 4),
}  # mode -> (overrides, version per batch, bound, dropping step)


@pytest.fixture(scope="module", params=sorted(EVERY_K))
def every_k(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    mode = request.param
    root = tmp_path_factory.mktemp(f"every-k-{mode}")
    args = [a for a in ASYNC if not a.startswith("async_training.mode")] + [
        f"async_training.mode={mode}",
        *EVERY_K[mode][0],
        "async_training.trigger_parameter_sync_step=2",
        "algorithm.filter_groups.carry_over_surplus=true",
        "data.gen_batch_size=8",
        f"trainer.experiment_name={mode}",
        f"trainer.rollout_data_dir={root / mode / 'batches'}",
    ]
    result = run_dapo_warm(["train", *args], root, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return mode, root / mode


def test_pushing_every_k_steps_with_carried_groups_keeps_every_sample_within_the_bound(every_k) -> None:
    mode, run_dir = every_k
    _, versions, bound, dropping_step = EVERY_K[mode]
    records = [r for r in records_of(run_dir) if r["step"] > 0]
    assert [r["async/weight_pushed"] for r in records] == [0, 1, 0, 1]  # after steps 2 and 4 only
    assert all(r["train/num_discarded_surplus_groups"] == 0 for r in records)  # carried, not discarded
    batches = trained_batches_of(run_dir)
    for step, lines in sorted(batches.items()):  # sample by sample: the engine held only the pushed versions
        assert {v for line in lines for v in line["weight_versions"]} == {versions[step - 1]}, step
        assert all(line["lag"] == step - 1 - versions[step - 1] <= bound for line in lines), step
        assert len({line["group"] for line in lines}) == GROUPS
    dropped = [r["async/stale_dropped_groups"] for r in records]
    # the batch that would train a carried group past the bound dropped it (the run had a surplus to carry there),
    # no other batch did
    assert dropped[dropping_step - 1] > 0 and sum(dropped) == dropped[dropping_step - 1], dropped


def versioned_group(token_versions: list[list[int]]):
    """A group whose responses are as long as their version lists, with those versions."""
    g = group(2, [len(v) for v in token_versions], [True] * len(token_versions))
    g.token_versions = token_versions
    return g


def test_staleness_metrics_count_every_sample_and_token() -> None:
    batch = ProducedBatch([versioned_group([[3, 3], [2, 3, 3]]), versioned_group([[1], []])], metrics={})
    assert sample_lags(batch, actor_version=3) == [0, 1, 2, 0]
    m = staleness_metrics(batch, actor_version=3)
    assert m["async/staleness/mean"] == 0.75 and m["async/staleness/max"] == 2
    assert m["async/staleness/token_mean"] == pytest.approx((0 + 0 + 1 + 0 + 0 + 2) / 6)
    assert m["async/partial_fraction"] == 0.25  # one of four samples spans two versions
    assert (
        m["async/staleness/samples_lag_0"],
        m["async/staleness/samples_lag_1"],
        m["async/staleness/samples_lag_2"],
    ) == (2, 1, 1)


def test_one_step_off_refuses_what_it_cannot_run() -> None:
    from dapo.config import ConfigError

    with pytest.raises(ConfigError, match="partial_rollout=true needs async_training.mode=fully_async"):
        build_config({}, ["async_training.mode=one_step_off", "async_training.partial_rollout=true"])
    for mode in ("one_step_off", "fully_async"):  # built now: tests below run both
        cfg = build_config(
            {},
            [
                f"async_training.mode={mode}",
                "async_training.trigger_parameter_sync_step=2",
                "algorithm.filter_groups.carry_over_surplus=true",
            ],
        )
        assert cfg.async_training.trigger_parameter_sync_step == 2 and cfg.algorithm.filter_groups.carry_over_surplus
    assert build_config({}, []).async_training.mode == "sync"  # the default run is the synchronous loop


def test_fully_async_accepts_multi_turn_rollouts() -> None:
    """A multi-turn trajectory carries each model token's version (dapo.rollout.multi_turn), so fully_async runs it
    under its staleness bound as a single-turn rollout (it was refused while those versions were not tracked)."""
    cfg = build_config({}, ["async_training.mode=fully_async", "rollout.multi_turn.enable=true"])
    assert cfg.async_training.mode == "fully_async" and cfg.rollout.multi_turn.enable
    assert build_config(
        {}, ["async_training.mode=one_step_off", "rollout.multi_turn.enable=true"]
    ).rollout.multi_turn.enable


CALCULATOR = str(Path(__file__).resolve().parents[2] / "configs" / "tools" / "tiny_calculator.yaml")


def test_fully_async_multi_turn_rollouts_train_within_the_staleness_bound(tmp_path: Path) -> None:
    """The tiny calculator preset, fully async with partial rollouts: a push may land between two turns of a
    trajectory or inside one; every trained sample is still within the threshold, counted over its model tokens."""
    result = run_dapo_warm(
        [
            "train",
            "--config",
            CALCULATOR,
            *FAST,
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.total_training_steps=3",
            "data.max_response_length=48",
            "algorithm.filter_groups.max_num_gen_batches=1",
            "rollout.multi_turn.sandbox.mode=unsafe-no-isolation",
            "async_training.mode=fully_async",
            "async_training.staleness_threshold=1",
            "async_training.partial_rollout=true",
            "async_training.partial_rollout_chunk_tokens=4",
            "async_training.rollout_num_threads=1",
            "trainer.experiment_name=mt",
            f"trainer.rollout_data_dir={tmp_path / 'mt' / 'batches'}",
        ],
        tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [r for r in records_of(tmp_path / "mt") if r["step"] > 0]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["async/staleness/max"] <= 1 and r["actor/old_log_prob_recomputed"] == 1.0, r
        assert r["tool/calls_per_sample"] > 0, r  # the tool ran: these are multi-turn trajectories
    assert records[0]["async/staleness/max"] == 0
    for step, lines in trained_batches_of(tmp_path / "mt").items():
        for line in lines:
            assert line["lag"] == step - 1 - min(line["weight_versions"]) <= 1, (step, line)
            assert max(line["weight_versions"]) <= step - 1
