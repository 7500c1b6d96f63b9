"""Where a step's time goes, by operator: ``torch.profiler`` over the phases that run the model, in chosen steps.

``trainer.profile_steps=[2]`` profiles step 2 of a run: each of its phases named in :data:`PROFILED_PHASES`
(generation, the reward, the old-log-prob pass, the update, the weight push) runs under a profiler of its own, so a
phase's table holds that phase alone. A phase that runs several times in the step (generation rounds of dynamic
sampling) adds up. When a phase ends, ``<run_dir>/profile/step<K>.json`` is rewritten (atomically) with every phase
so far: its wall seconds and its operators by self time (calls, self and total seconds, share of the phase), once
by name and once by name and input shapes (``by_shape``: which ``aten::mm`` is the LM head), and ``step<K>.txt``
with the same as tables. Under torchrun every rank profiles its own work and writes
``step<K>-rank<R>.*``.

Self time is the time an operator spends on the calling thread outside the operators it calls, so the self times
of a phase add up to the time its Python code spent inside torch operators; intra-op threads working for an
operator (a matrix product on 2 cores) are not counted again. ``share`` is self time over the phase's wall time.
On CUDA each device kernel is an entry of its own, by kernel name, with its time on the device (``self_device_s``);
the CPU operators that launched it keep only their CPU time (not yet run on a GPU: no GPU was lent to this project's
CPU sessions).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.autograd import DeviceType

from dapo.infra.atomic import atomic_write_files

__all__ = ["PROFILED_PHASES", "PhaseProfile", "StepProfiler", "format_profile"]

# The PhaseTimer phases of a step that do the work (not "step", which holds them, nor waiting or gathering).
PROFILED_PHASES = ("gen", "reward", "old_log_prob", "update_actor", "sync_weights")

NS = 1e-9


@dataclass
class OperatorTotals:
    calls: int = 0
    self_s: float = 0.0
    total_s: float = 0.0
    self_device_s: float = 0.0


@dataclass
class PhaseProfile:
    wall_s: float = 0.0
    runs: int = 0
    operators: dict[str, OperatorTotals] = field(default_factory=dict)
    by_shape: dict[str, OperatorTotals] = field(default_factory=dict)  # "op [input shapes]"

    def add(self, profiler: torch.profiler.profile, wall_s: float) -> None:
        """Adds one profiled run of the phase."""
        self.wall_s += wall_s
        self.runs += 1
        _add_events(self.operators, self.by_shape, profiler.profiler.kineto_results.events())

    def top(self, limit: int, totals: dict[str, OperatorTotals] | None = None) -> list[dict[str, float | int | str]]:
        totals = self.operators if totals is None else totals
        ranked = sorted(totals.items(), key=lambda kv: kv[1].self_s + kv[1].self_device_s, reverse=True)
        wall = max(self.wall_s, 1e-12)
        return [
            {
                "op": name,
                "calls": op.calls,
                "self_s": round(op.self_s, 6),
                "total_s": round(op.total_s, 6),
                "share": round(op.self_s / wall, 4),
                **({"self_device_s": round(op.self_device_s, 6)} if op.self_device_s else {}),
            }
            for name, op in ranked[:limit]
        ]


def _add_events(by_name: dict[str, OperatorTotals], by_shape: dict[str, OperatorTotals], events) -> None:
    """Self and total time per operator from the profiler's raw events.

    What ``profiler.key_averages()`` computes, without building its Python ``FunctionEvent`` tree, which cost ~0.1 ms
    per recorded call (three minutes for one SmolLM2 step): per thread, an operator's self time is its duration less
    that of the operators it directly encloses. A device kernel (CUDA) is an entry of its own, by kernel name, with
    its duration as device time. tests/infra/test_profiling.py checks the result against ``key_averages()``.
    """

    def record(name: str, shape_key: str, *, self_s: float = 0.0, total_s: float = 0.0, device_s: float = 0.0) -> None:
        for totals, key in ((by_name, name), (by_shape, shape_key)):
            op = totals.setdefault(key, OperatorTotals())
            op.calls += 1
            op.self_s += self_s
            op.total_s += total_s
            op.self_device_s += device_s

    threads: dict[int, list] = defaultdict(list)
    for event in events:
        if event.is_async():
            continue
        if event.device_type() != DeviceType.CPU:
            record(event.name(), event.name(), device_s=event.duration_ns() * NS)
        else:
            threads[event.start_thread_id()].append((event.start_ns(), event.duration_ns(), event))

    def close(duration: int, children: int, event) -> None:
        name = event.name()
        record(name, f"{name} {event.shapes()}", self_s=(duration - children) * NS, total_s=duration * NS)

    for spans in threads.values():
        spans.sort(key=lambda span: (span[0], -span[1]))  # an enclosing operator before what it encloses
        # [end, children's duration, duration, event, merged] of the open operators. An operator directly inside one
        # of the same name (aten::sum calling its dim overload) is merged into it, as key_averages does: not a call
        # of its own, and what it encloses counts as enclosed by the outer one.
        stack: list[list] = []

        def pop() -> None:
            _, children, length, ended, merged = stack.pop()
            if merged:
                stack[-1][1] += children
            else:
                close(length, children, ended)

        for start, duration, event in spans:
            while stack and stack[-1][0] <= start:
                pop()
            merged = bool(stack) and stack[-1][3].name() == event.name()
            if stack and not merged:
                stack[-1][1] += duration
            stack.append([start + duration, 0, duration, event, merged])
        while stack:
            pop()


class StepProfiler:
    """The profiler of one step (module docstring); ``phase(name)`` wraps a PhaseTimer phase."""

    def __init__(self, out_dir: Path, step: int, *, rank: int | None = None, top: int = 30) -> None:
        suffix = f"step{step}" if rank is None else f"step{step}-rank{rank}"
        self.json_path = out_dir / f"{suffix}.json"
        self.text_path = out_dir / f"{suffix}.txt"
        self.step = step
        self.top = top
        self.phases: dict[str, PhaseProfile] = {}
        self._active = False  # phases may nest; only the outermost profiled one runs a profiler

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PROFILED_PHASES or self._active:
            yield
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._active = True
        try:
            with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
                start = time.perf_counter()
                yield
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                wall = time.perf_counter() - start
        finally:
            self._active = False
        self.phases.setdefault(name, PhaseProfile()).add(prof, wall)
        self._write()

    def summary(self) -> dict:
        return {
            "step": self.step,
            "torch": torch.__version__,
            "phases": {
                name: {
                    "wall_s": round(p.wall_s, 6),
                    "runs": p.runs,
                    "operators": p.top(self.top),
                    "by_shape": p.top(self.top, p.by_shape),
                }
                for name, p in self.phases.items()
            },
        }

    def _write(self) -> None:
        summary = self.summary()
        atomic_write_files(
            [
                (self.json_path, lambda p: p.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")),
                (self.text_path, lambda p: p.write_text(format_profile(summary), encoding="utf-8")),
            ]
        )


def format_profile(summary: dict, limit: int = 15) -> str:
    """The phases of a profile summary as text tables, the top ``limit`` operators of each by self time."""
    lines = []
    for name, phase in summary["phases"].items():
        lines.append(f"step {summary['step']}, phase {name}: {phase['wall_s']:.3f} s wall over {phase['runs']} run(s)")
        lines.append(f"  {'operator':<48} {'calls':>8} {'self s':>9} {'share':>7} {'total s':>9}")
        for op in phase["operators"][:limit]:
            lines.append(
                f"  {op['op'][:48]:<48} {op['calls']:>8} {op['self_s']:>9.3f} {op['share']:>7.1%} {op['total_s']:>9.3f}"
            )
        lines.append("  the same by input shapes:")
        for op in phase["by_shape"][:limit]:
            lines.append(f"  {op['op'][:90]:<90} {op['calls']:>8} {op['self_s']:>9.3f} {op['share']:>7.1%}")
        lines.append("")
    return "\n".join(lines)
