"""``dapo eval``'s engine: sample K responses per problem, score them, stream them to a file, summarise, resume.

Output. Every sample is one JSON line of ``OUTPUT`` (default ``*.jsonl``), appended and flushed as soon as it is
scored: ``problem_key``, ``problem_id``, ``data_source``, ``sample_index``, ``prompt``, ``ground_truth``, ``response``,
``prediction``, ``score``, ``acc``, ``finish_reason``, ``prompt_tokens``, ``response_tokens``, and with the multi-turn
tool loop (``EvalSettings.multi_turn``) ``tool_calls``, each call's result category. The summary (settings
and metrics, :mod:`dapo.evaluation.metrics`) goes to ``OUTPUT`` with suffix ``.summary.json``, written atomically; it
holds nothing that depends on timing, so a resumed run's summary is byte-for-byte an uninterrupted run's.

Resume. Running again with the same output file reads the finished samples back (a half-written last line from a
killed run is cut off) and generates only what is missing. The settings that decide the samples (model, files, n,
sampling, seed, template) must match the earlier run's, else the run stops with a message.

Determinism. Local engine: problems are cut into fixed chunks of ``batch_size`` problems over the *whole* file and chunk
``c`` is sampled in one engine call seeded with ``seed + c``; a chunk with any missing sample is generated again in full
(same call, same seed, same samples) and only its missing samples are written. So a resumed run equals an uninterrupted
one. Server: each sample is its own request with seed ``sample_seed(seed, problem, index)``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo.evaluation.backends import EvalError, Generated, LocalBackend, OpenAIBackend
from dapo.evaluation.metrics import SampleOutcome, summarize_samples
from dapo.evaluation.problems import EvalProblem
from dapo.infra.atomic import atomic_write
from dapo.reward.batch import score_batch
from dapo.reward.records import RewardInput
from dapo.rollout.base import SamplingParams
from dapo.tools.result import TOOL_CATEGORIES

Progress = Callable[[int, int, float], None]  # (samples done, samples total, accuracy so far)

SETTINGS_THAT_DECIDE_SAMPLES: tuple[str, ...] = (
    "model",
    "test_files",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "template",
    "max_problems",
    "backend",
    "multi_turn",
)


@dataclass(frozen=True)
class EvalSettings:
    model: str
    test_files: tuple[str, ...]
    n: int = 1
    temperature: float = 1.0
    top_p: float = 0.7
    top_k: int = -1
    max_tokens: int = 1024
    seed: int = 0
    template: str = "dapo"
    max_problems: int | None = None
    backend: str = "hf"  # "hf" / "vllm" / "openai"
    batch_size: int = 8  # local engine: problems per engine call (part of the sampling order, so recorded)
    multi_turn: dict[str, Any] | None = None  # the tool loop's settings (rollout.multi_turn), None = single turn

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    def params(self, seed: int | None) -> SamplingParams:
        return SamplingParams(
            n=1, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_tokens=self.max_tokens, seed=seed
        )


def summary_path(output: str | Path) -> Path:
    p = Path(output)
    return p.with_name(p.stem + ".summary.json")


def sample_seed(seed: int, problem_key: str, sample_index: int) -> int:
    blob = f"{seed}:{problem_key}:{sample_index}".encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "big") >> 1


_LINE_START = b'{"problem_key": '  # how every line _Writer writes begins (json.dumps of _row, keys in order)
# Every field of a samples line and the types it may have: a resumed line feeds the metrics, so a line whose "acc"
# is the string "False" (truthy) must be refused, not counted as correct.
_SAMPLE_FIELDS: dict[str, tuple[type, ...]] = {
    "problem_key": (str,),
    "problem_id": (str,),
    "data_source": (str,),
    "sample_index": (int,),
    "prompt": (str,),
    "ground_truth": (str,),
    "response": (str,),
    "prediction": (str, type(None)),
    "score": (int, float),
    "acc": (bool,),
    "finish_reason": (str, type(None)),
    "prompt_tokens": (int,),
    "response_tokens": (int,),
}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}
# Multi-turn samples also carry "tool_calls": each tool call's result category, in order.


def _sample_problem(row: Any) -> str | None:
    """None when ``row`` (one parsed line) is a sample line as ``run_eval`` writes it, else what is wrong."""
    if not isinstance(row, dict):
        return f"is a JSON {type(row).__name__}, not an object"
    for name, types in _SAMPLE_FIELDS.items():
        if name not in row:
            return f'has no "{name}"'
        value = row[name]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            wanted = " or ".join(_TYPE_NAMES[t] for t in types)
            return f'has "{name}": {json.dumps(value)[:60]}, which must be {wanted}'
        if name in ("sample_index", "prompt_tokens", "response_tokens") and value < 0:
            return f'has "{name}": {value}, which must be >= 0'
    calls = row.get("tool_calls")
    if "tool_calls" in row and not (isinstance(calls, list) and all(c in TOOL_CATEGORIES for c in calls)):
        return f'has "tool_calls": {json.dumps(calls)[:60]}, which must be a list of {", ".join(TOOL_CATEGORIES)}'
    return None


def _torn_tail(tail: bytes) -> bool:
    """Whether ``tail`` (after the last newline) can be the start of a line cut off by a killed run: it begins as
    every written line begins, and is UTF-8 but for a character cut in two at its very end."""
    if not (tail.startswith(_LINE_START) or _LINE_START.startswith(tail)):
        return False
    for cut in range(4):  # a UTF-8 character has at most 4 bytes, so at most 3 of them can be left over
        try:
            tail[: len(tail) - cut].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    return False


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The complete sample lines of an output file; a torn last line (a killed run) is cut off the file.

    Every complete line is checked first (UTF-8, JSON, each field's type, ``_SAMPLE_FIELDS``): a file with any
    line that is not a sample line is refused with an ``EvalError`` naming the line, and is never modified; the
    torn last line is cut off only from a file whose every other line is a sample line, and only when it looks like
    the beginning of one."""
    if not path.exists():
        return []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EvalError(f"{path}: cannot read it ({exc.strerror or exc}); choose another --output") from None
    cut = data.rfind(b"\n") + 1
    not_ours = "it is not a dapo eval samples file, or it was edited: choose another --output"
    rows = []
    for lineno, raw in enumerate(data[:cut].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EvalError(
                f"{path} line {lineno} is not UTF-8 text (byte {exc.start} of the line is "
                f"{raw[exc.start]:#04x}); {not_ours}"
            ) from None
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise EvalError(f"{path} line {lineno} is not JSON ({e.msg}); {not_ours}") from None
        problem = _sample_problem(row)
        if problem is not None:
            raise EvalError(f"{path} line {lineno} {problem}; {not_ours}")
        rows.append(row)
    tail = data[cut:]
    if tail:
        if not _torn_tail(tail):
            last = data.count(b"\n") + 1
            raise EvalError(
                f"{path} line {last} (its last, without a newline) is not the start of a sample line; {not_ours}"
            )
        with open(path, "r+b") as f:
            f.truncate(cut)
    return rows


class _Writer:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def _check_resume(settings: EvalSettings, output: Path, done: list[dict[str, Any]]) -> None:
    spath = summary_path(output)
    if not spath.exists():
        if done:
            raise EvalError(
                f"{output} holds {len(done)} samples but {spath} is missing, so the settings they were "
                "made with are unknown; choose another --output"
            )
        return
    try:
        earlier = json.loads(spath.read_text(encoding="utf-8")).get("settings", {})
    except (OSError, ValueError) as e:
        raise EvalError(f"{spath} cannot be read ({e}); delete it and {output}, or choose another --output") from None
    now = settings.to_dict()
    diff = [
        k
        for k in SETTINGS_THAT_DECIDE_SAMPLES + (("batch_size",) if settings.backend != "openai" else ())
        if earlier.get(k) != now.get(k)
    ]
    if diff and done:
        shown = ", ".join(f"{k}: {earlier.get(k)!r} -> {now.get(k)!r}" for k in diff)
        raise EvalError(
            f"{output} was made with other settings ({shown}); resume with the same settings or choose another --output"
        )
    _check_tool_calls(settings, output, done)


def _check_tool_calls(settings: EvalSettings, output: Path, done: list[dict[str, Any]]) -> None:
    """A resumed multi-turn line's tool calls feed the summary's tool/* metrics, so their count is checked against
    what the loop can make: one call per model turn, none in the last (MultiTurnParams), and none in single turn."""
    most = 0 if settings.multi_turn is None else int(settings.multi_turn["max_assistant_turns"]) - 1
    for row in done:
        calls = row.get("tool_calls")
        where = f"{output}: the line of problem {row['problem_key']!r} sample {row['sample_index']}"
        if settings.multi_turn is not None and calls is None:
            raise EvalError(
                f'{where} has no "tool_calls", which every multi-turn sample records; '
                "it is not this eval's samples file, or it was edited: choose another --output"
            )
        if calls is not None and len(calls) > most:
            raise EvalError(
                f"{where} records {len(calls)} tool calls, more than the {most} this loop can make "
                f"(max_assistant_turns={most + 1 if settings.multi_turn else 'single turn'}, no call in "
                "the last turn); it was edited: choose another --output"
            )


def write_summary(output: Path, settings: EvalSettings, rows: Sequence[dict[str, Any]], total: int) -> dict[str, Any]:
    outcomes = sorted((SampleOutcome.from_record(r) for r in rows), key=lambda s: (s.problem_key, s.sample_index))
    complete = len({(s.problem_key, s.sample_index) for s in outcomes}) >= total
    summary = {
        "settings": settings.to_dict(),
        "status": "complete" if complete else "partial",
        "samples_file": output.name,
        "samples_expected": total,
        "metrics": summarize_samples(outcomes) if outcomes else {},
    }
    atomic_write(summary_path(output), json.dumps(summary, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return summary


def _row(problem: EvalProblem, index: int, gen: Generated, result) -> dict[str, Any]:
    return {
        "problem_key": problem.key,
        "problem_id": problem.problem_id,
        "data_source": problem.data_source,
        "sample_index": index,
        "prompt": problem.prompt_text,
        "ground_truth": problem.ground_truth,
        "response": gen.text,
        "prediction": result.pred,
        "score": result.score,
        "acc": bool(result.acc),
        "finish_reason": gen.finish_reason,
        "prompt_tokens": gen.prompt_tokens,
        "response_tokens": gen.response_tokens,
        **({} if gen.tool_calls is None else {"tool_calls": list(gen.tool_calls)}),
    }


def _score(problems: Sequence[EvalProblem], gens: Sequence[Generated], reward_workers: int):
    items = [
        RewardInput(p.data_source, g.scored_text, p.ground_truth, dict(p.extra_info) or None)
        for p, g in zip(problems, gens)
    ]
    return score_batch(items, num_workers=reward_workers)


def run_eval(
    problems: Sequence[EvalProblem],
    backend: LocalBackend | OpenAIBackend,
    settings: EvalSettings,
    output: str | Path,
    *,
    progress: Progress | None = None,
    reward_workers: int = 0,
) -> dict[str, Any]:
    """Evaluate, resuming from ``output``; returns the summary (also written next to ``output``)."""
    output = Path(output)
    if output.suffix.lower() not in (".jsonl", ".json"):
        raise EvalError(f"--output {output}: the samples file must end in .jsonl")
    if not problems:
        raise EvalError("no problems to evaluate")
    if settings.multi_turn is not None and not isinstance(backend, LocalBackend):
        raise EvalError(
            "the multi-turn tool loop runs on a local engine (--backend hf or vllm), where trajectories "
            "are built token in, token out; a server behind --base-url cannot run it"
        )
    done_rows = read_samples(output)
    _check_resume(settings, output, done_rows)
    wanted = {p.key: p.repeats * settings.n for p in problems}
    done_rows = [
        r
        for r in done_rows
        if r.get("problem_key") in wanted and 0 <= r.get("sample_index", -1) < wanted[r["problem_key"]]
    ]
    done = {(r["problem_key"], r["sample_index"]) for r in done_rows}
    total = sum(wanted.values())
    write_summary(output, settings, done_rows, total)  # records the settings before any sample is written
    rows = list(done_rows)
    state = {"done": len(done), "correct": sum(bool(r["acc"]) for r in done_rows)}

    def record(row: dict[str, Any], writer: _Writer) -> None:
        writer.write(row)
        rows.append(row)
        state["done"] += 1
        state["correct"] += int(row["acc"])
        if progress is not None:
            progress(state["done"], total, state["correct"] / max(state["done"], 1))

    if progress is not None:
        progress(state["done"], total, state["correct"] / max(state["done"], 1))
    writer = _Writer(output)
    try:
        if isinstance(backend, LocalBackend):
            _run_local(problems, backend, settings, wanted, done, lambda row: record(row, writer), reward_workers)
        else:
            asyncio.run(
                _run_remote(problems, backend, settings, wanted, done, lambda row: record(row, writer), reward_workers)
            )
    finally:
        writer.close()
    return write_summary(output, settings, rows, total)


def _run_local(problems, backend: LocalBackend, settings: EvalSettings, wanted, done, record, reward_workers) -> None:
    size = max(1, settings.batch_size)
    for chunk_index, start in enumerate(range(0, len(problems), size)):
        chunk = problems[start : start + size]
        missing = [(p, j) for p in chunk for j in range(wanted[p.key]) if (p.key, j) not in done]
        if not missing:
            continue
        gens = backend.generate(
            [p.messages for p in chunk], [wanted[p.key] for p in chunk], settings.params(settings.seed + chunk_index)
        )
        todo = [(p, j, gens[i][j]) for i, p in enumerate(chunk) for j in range(wanted[p.key]) if (p.key, j) not in done]
        results = _score([p for p, _, _ in todo], [g for _, _, g in todo], reward_workers)
        for (p, j, g), result in zip(todo, results):
            record(_row(p, j, g, result))


async def _run_remote(
    problems, backend: OpenAIBackend, settings: EvalSettings, wanted, done, record, reward_workers
) -> None:
    async with backend:

        async def one(problem: EvalProblem, index: int) -> None:
            gen = await backend.complete(
                problem.messages, settings.params(sample_seed(settings.seed, problem.key, index))
            )
            result = (await asyncio.to_thread(_score, [problem], [gen], reward_workers))[0]
            record(_row(problem, index, gen, result))

        tasks = [
            asyncio.ensure_future(one(p, j)) for p in problems for j in range(wanted[p.key]) if (p.key, j) not in done
        ]
        try:
            for fut in asyncio.as_completed(tasks):
                await fut
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class ProgressLine:
    """A one-line progress display on stderr: samples done, accuracy so far, rate, time left."""

    def __init__(self, stream=None, label: str = "eval") -> None:
        import sys

        self.stream = stream or sys.stderr
        self.label = label
        self.start = time.monotonic()
        self.first: int | None = None
        self.last_print = 0.0
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    def __call__(self, done: int, total: int, acc: float) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = done
        if done < total and now - self.last_print < (0.2 if self.tty else 5.0):
            return
        self.last_print = now
        elapsed = now - self.start
        new = done - self.first
        rate = new / elapsed if elapsed > 0 else 0.0
        left = f", ~{(total - done) / rate:.0f}s left" if rate > 0 and done < total else ""
        line = f"{self.label}: {done}/{total} samples, acc {acc:.3f}, {rate:.1f} samples/s{left}"
        if self.tty:
            self.stream.write("\r" + line.ljust(80) + ("\n" if done >= total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
