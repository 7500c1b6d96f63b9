"""The training loop over each batch source, with generation and the update replaced by timed stand-ins.

The real ``train_loop`` and the real sources run; only ``generate_and_filter`` (a fixed wait, recording which weight
version the engine held when each batch started) and ``update_actor`` (a slower wait) are stand-ins, so the
schedule the sources promise (docs/async.md) is checked where the producer can run ahead: a producer let one version
past the bound, a one-step-off made serial, or a fully async made synchronous each fail a test here.
"""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import pytest

from dapo.config import build_config
from dapo.distributed.world import World
from dapo.infra.timing import PhaseTimer
from dapo.training import batch_source, loop, producers
from dapo.training.errors import TrainingError
from dapo.training.push_schedule import PushSchedule
from tests.training.test_perf_metrics import group

GEN_S, UPDATE_S, STEPS = 0.1, 0.3, 5


class FakeRun:
    """What ``train_loop`` and the sources read of a ``Run``; pushes set the engine's version as the real one does."""

    def __init__(self, *overrides: str) -> None:
        self.cfg = build_config({}, list(overrides))
        self.world = World()
        self.total_steps = STEPS
        self.engine = SimpleNamespace(weight_version=0)
        self.state = SimpleNamespace(
            step=0, prefetched=[], val_history=[], generation_state=dict, load_generation_state=lambda state: None
        )
        self.sync = SimpleNamespace(push=self._push)
        self.perf = SimpleNamespace(count_generated=lambda groups: None, metrics=lambda *a, **k: {})
        self.policy = SimpleNamespace(tokenizer=None)
        self.optimizer = self.scheduler = self.scorer = self.teachers = None
        self.engine_samples_from_actor = False
        self.records: list[dict] = []
        self.generated: dict[int, tuple[int, float, float]] = {}  # batch -> (engine version at its start, start, end)
        self.updates: dict[int, tuple[float, float]] = {}
        self.pushed: list[int] = []  # the versions pushed, in order (the run's first push included)

    def _push(self, step: int) -> dict:
        self.engine.weight_version = step
        self.pushed.append(step)
        return {}

    @contextlib.contextmanager
    def record(self):
        yield None, None

    def start(self, tracker, progress) -> dict:
        return self._push(self.state.step)

    def timer(self, *phases: str, step: int) -> PhaseTimer:
        return PhaseTimer("gen", "reward", "old_log_prob", *phases)

    def dump_batch(self, step, groups, *, with_versions) -> None:
        pass

    def end_step(self, step, metrics, timer, tracker, progress, checkpoint_state=None) -> dict:
        self.state.step = step
        self.records.append(metrics)
        return {}

    def result(self):
        return self.records


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch):
    """Generation and the update replaced by waits that record their intervals on the run."""

    def generate(
        engine, state, tokenizer, cfg, step, timer, scorer=None, world=None, on_round=None, oldest_version=None
    ):
        run = current["run"]
        t0 = time.perf_counter()
        version = run.engine.weight_version
        with timer("gen"):
            time.sleep(GEN_S)
        run.generated[step] = (version, t0, time.perf_counter())
        return [group(2, [3, 2], [True, False])], {}

    def update(groups, policy, optimizer, scheduler, cfg, step, timer, **kwargs):
        t0 = time.perf_counter()
        time.sleep(UPDATE_S)
        current["run"].updates[step] = (t0, time.perf_counter())
        return {}

    current: dict = {}
    monkeypatch.setattr(batch_source, "generate_and_filter", generate)
    monkeypatch.setattr(producers, "generate_and_filter", generate)
    monkeypatch.setattr(loop, "update_actor", update)

    def train(*overrides: str) -> FakeRun:
        run = current["run"] = FakeRun(*overrides)
        loop.train_loop(run, loop.SOURCES[run.cfg.async_training.mode](run))
        return run

    return train


def lag_of(run: FakeRun, step: int) -> int:
    """Versions between step ``step``'s actor (step-1) and the weights its batch started from."""
    return (step - 1) - run.generated[step][0]


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def test_sync_generates_each_batch_with_the_actors_weights_and_overlaps_nothing(stand_ins) -> None:
    run = stand_ins()
    assert [lag_of(run, s) for s in range(1, STEPS + 1)] == [0] * STEPS
    assert all(r["async/overlap_s"] == 0.0 and r["async/staleness/max"] == 0 for r in run.records)
    assert all(r["async/engine_idle_s"] >= UPDATE_S * 0.9 for r in run.records)  # the engine waits for the update


def test_one_step_off_generates_the_next_batch_during_the_update_one_version_behind(stand_ins) -> None:
    run = stand_ins("async_training.mode=one_step_off")
    assert [lag_of(run, s) for s in range(1, STEPS + 1)] == [0] + [1] * (STEPS - 1)  # exactly 1 after step 1
    for step in range(1, STEPS):  # batch step+1 is generated while step trains (not after: that would be serial)
        assert overlap(run.generated[step + 1][1:], run.updates[step]) >= GEN_S * 0.8, step
        assert run.records[step - 1]["async/overlap_s"] >= GEN_S * 0.8
        assert (
            run.records[step - 1]["async/staleness/samples_lag_1" if step > 1 else "async/staleness/samples_lag_0"] == 2
        )
    assert run.records[-1]["async/overlap_s"] == 0.0  # nothing left to generate during the last update


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_fully_async_runs_ahead_exactly_as_far_as_the_staleness_bound(stand_ins, bound: int) -> None:
    """Generation is faster than the update, so the producer starts every batch as soon as the bound allows: batch j
    starts once step j-1-bound is pushed, and its lag is min(j-1, bound) exactly (a producer let one version past
    the bound would lag bound+1, and the loop refuses to train it; one held to the actor's pace would lag 0)."""
    run = stand_ins("async_training.mode=fully_async", f"async_training.staleness_threshold={bound}")
    assert [lag_of(run, s) for s in range(1, STEPS + 1)] == [min(s - 1, bound) for s in range(1, STEPS + 1)]
    assert max(r["async/staleness/max"] for r in run.records) == bound
    if bound > 0:  # the next batch's generation ran during the update
        assert sum(r["async/overlap_s"] for r in run.records) >= (STEPS - 1) * GEN_S * 0.8


def test_fully_async_refuses_a_batch_older_than_the_bound(stand_ins, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's own check, behind the producer's: a batch stamped one version too old never trains."""
    real = producers.produce_batch
    monkeypatch.setattr(
        producers, "produce_batch", lambda run, step, version, bound: real(run, step, version - 1, bound)
    )
    with pytest.raises(
        TrainingError, match="lags 2 weight versions behind the actor, more than async_training.staleness_threshold=1"
    ):
        stand_ins("async_training.mode=fully_async", "async_training.staleness_threshold=1")


K = 2  # async_training.trigger_parameter_sync_step of the tests below


def pushes_every_k(run: FakeRun) -> None:
    """The pushes are the run's first, every K-th step's and the last step's, and each record says whether its step
    pushed."""
    assert run.pushed == [0, *range(K, STEPS + 1, K), *([STEPS] if STEPS % K else [])]
    assert [r["async/weight_pushed"] for r in run.records] == [
        float(s % K == 0 or s == STEPS) for s in range(1, STEPS + 1)
    ]


@pytest.mark.parametrize("threshold", [0, 1])
def test_fully_async_pushing_every_k_steps_runs_ahead_as_far_as_the_bound_in_pushes(stand_ins, threshold) -> None:
    """trigger_parameter_sync_step=2: batch j starts once the engine holds weights at most ``threshold`` pushes older
    than the newest push step j's actor has passed (2 * (j-1) // 2), so with generation faster than the update its
    lag is exactly (j-1) - max(0, that push - 2 * threshold): threshold 0 gives 0, 1, 0, 1, 0 and threshold 1 gives
    0, 1, 2, 3, 2, reaching the bound (threshold + 1) * 2 - 1 in steps and never passing it."""
    run = stand_ins(
        "async_training.mode=fully_async",
        f"async_training.staleness_threshold={threshold}",
        f"async_training.trigger_parameter_sync_step={K}",
    )
    pushes_every_k(run)
    expected = {0: [0, 1, 0, 1, 0], 1: [0, 1, 2, 3, 2]}[threshold]
    assert [lag_of(run, s) for s in range(1, STEPS + 1)] == expected
    bound = PushSchedule(K, 0, STEPS).fully_async_bound(threshold)
    assert bound == (threshold + 1) * K - 1 and max(r["async/staleness/max"] for r in run.records) == max(expected)


def test_one_step_off_pushing_every_k_steps_draws_each_batch_from_the_last_push(stand_ins) -> None:
    """trigger_parameter_sync_step=2: batch j is drawn while step j-1 trains, from the last push before it (steps 0,
    0, 2, 2 for batches 2..5): lags 0, 1, 2, 1, 2, at most k, and the next batch still overlaps every update."""
    run = stand_ins("async_training.mode=one_step_off", f"async_training.trigger_parameter_sync_step={K}")
    pushes_every_k(run)
    assert [lag_of(run, s) for s in range(1, STEPS + 1)] == [0, 1, 2, 1, 2]
    for step in range(1, STEPS):
        assert overlap(run.generated[step + 1][1:], run.updates[step]) >= GEN_S * 0.8, step


def test_the_sync_loop_pushes_after_every_step_and_refuses_fewer_pushes(stand_ins) -> None:
    from dapo.config import ConfigError

    run = stand_ins()
    assert run.pushed == list(range(STEPS + 1))
    assert all(r["async/weight_pushed"] == 1.0 for r in run.records)
    with pytest.raises(ConfigError, match="trigger_parameter_sync_step=2 needs async_training.mode=one_step_off"):
        build_config({}, ["async_training.trigger_parameter_sync_step=2"])


def test_the_push_schedule_by_hand() -> None:
    """Pushes after steps 3, 6, 9 and the last (10); a run resumed at step 4 holds version 4 until step 6's push."""
    schedule = PushSchedule(every=3, start=4, last=10)
    assert [s for s in range(5, 11) if schedule.due(s)] == [6, 9, 10]
    assert [schedule.latest_push(v) for v in range(4, 10)] == [4, 4, 6, 6, 6, 9]
    assert schedule.fully_async_start(batch=8, staleness_threshold=1) == 6 - 3  # batch 8's actor: version 7
    assert (schedule.fully_async_bound(1), schedule.one_step_off_bound()) == (5, 3)
