"""trainer.profile_steps: each profiled phase of a step gets its own operator table, counted from real torch calls."""

import json

import pytest
import torch

from dapo.config import ConfigError
from dapo.config.loading import build_config
from dapo.infra.profiling import PhaseProfile, StepProfiler, format_profile
from dapo.infra.timing import PhaseTimer


def _mm(times: int) -> None:
    a = torch.ones(8, 8)
    for _ in range(times):
        a = torch.mm(a, a) / 8


def _bmm(times: int) -> None:
    a = torch.ones(2, 4, 4)
    for _ in range(times):
        a = torch.bmm(a, a) / 4


def _ops(summary: dict, phase: str) -> dict[str, dict]:
    return {op["op"]: op for op in summary["phases"][phase]["operators"]}


def test_each_phase_holds_only_its_own_operators_and_repeated_phases_add_up(tmp_path):
    profiler = StepProfiler(tmp_path / "profile", step=3)
    timer = PhaseTimer("gen", profiler=profiler)
    with timer("step"):  # holds the others; not profiled itself
        with timer("gen"):
            _mm(3)
        with timer("gen"):  # a second generation round (dynamic sampling)
            _mm(2)
        with timer("update_actor"):
            _bmm(4)
        with timer("wait_rollout"):  # not a phase that runs the model
            _mm(7)
    summary = json.loads((tmp_path / "profile" / "step3.json").read_text())
    assert summary["step"] == 3 and set(summary["phases"]) == {"gen", "update_actor"}
    gen, update = _ops(summary, "gen"), _ops(summary, "update_actor")
    assert summary["phases"]["gen"]["runs"] == 2 and summary["phases"]["update_actor"]["runs"] == 1
    assert gen["aten::mm"]["calls"] == 5 and "aten::bmm" not in gen
    assert update["aten::bmm"]["calls"] == 4 and "aten::mm" not in update
    by_shape = {op["op"]: op for op in summary["phases"]["gen"]["by_shape"]}
    assert by_shape["aten::mm [[8, 8], [8, 8]]"]["calls"] == 5
    for phase in summary["phases"].values():
        assert 0 < phase["wall_s"]
        ranked = [op["self_s"] for op in phase["operators"]]
        assert ranked == sorted(ranked, reverse=True)
        assert all(0 <= op["self_s"] <= op["total_s"] + 1e-6 and 0 <= op["share"] <= 1 for op in phase["operators"])
        assert sum(op["self_s"] for op in phase["operators"]) <= phase["wall_s"] + 1e-3
    # the timer still times every phase, profiled or not
    assert set(timer.seconds) >= {"step", "gen", "update_actor", "wait_rollout"}
    text = (tmp_path / "profile" / "step3.txt").read_text()
    assert text == format_profile(summary) and "phase update_actor" in text and "aten::bmm" in text


def test_a_profiled_phase_inside_another_is_counted_in_the_outer_one_only(tmp_path):
    profiler = StepProfiler(tmp_path, step=1, rank=1)
    with profiler.phase("update_actor"):
        _bmm(2)
        with profiler.phase("old_log_prob"):  # torch.profiler does not nest: the outer profile holds it
            _mm(3)
    summary = json.loads((tmp_path / "step1-rank1.json").read_text())
    assert set(summary["phases"]) == {"update_actor"}
    ops = _ops(summary, "update_actor")
    assert ops["aten::mm"]["calls"] == 3 and ops["aten::bmm"]["calls"] == 2


def test_profile_steps_are_positive_step_numbers():
    assert build_config(overrides=["trainer.profile_steps=[2,5]"]).trainer.profile_steps == [2, 5]
    with pytest.raises(ConfigError) as info:
        build_config(overrides=["trainer.profile_steps=[0]"])
    assert "trainer.profile_steps" in str(info.value)


def test_self_and_total_times_are_those_of_torchs_key_averages():
    weight = torch.randn(16, 16, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(20):  # nested operators (matmul > mm, to > _to_copy > copy_) and an autograd backward
            x = torch.randn(8, 16).to(torch.float64).float()
            (x @ weight).relu().sum().backward()
    ours = PhaseProfile()
    ours.add(prof, wall_s=1.0)
    theirs = {event.key: event for event in prof.key_averages()}
    assert set(ours.operators) == set(theirs)
    for name, op in ours.operators.items():
        event = theirs[name]
        assert op.calls == event.count, name
        assert abs(op.total_s - event.cpu_time_total * 1e-6) < 2e-6 * event.count + 1e-6, name
        assert abs(op.self_s - event.self_cpu_time_total * 1e-6) < 2e-6 * event.count + 1e-6, name
    shapes = {f"{event.key} {event.input_shapes}": event for event in prof.key_averages(group_by_input_shape=True)}
    assert set(ours.by_shape) == set(shapes)
    assert all(ours.by_shape[key].calls == event.count for key, event in shapes.items())
