"""Multi-turn rollouts with a code interpreter, on top of any :class:`~dapo.rollout.base.RolloutEngine`.

The model generates until a tool call closes (by default a fenced ```` ```python ```` block, as ReTool (arXiv
2504.11536) formats it), the interpreter runs the code, its output is appended as tokens, and the model continues;
up to ``max_assistant_turns`` model turns, ``max_response_length`` trajectory tokens in all (model and tool tokens
together, as verl's ``response_length``) and ``max_tool_response_length`` tokens per tool output.

Token in, token out: a trajectory is the concatenation of token ids *as they were sampled* and of each tool output
*as it was encoded* (alone, ``add_special_tokens=False``), never a decoded-and-re-encoded string; so the engine's
log-probs of the model's tokens are exactly what the actor's teacher-forced pass over prompt + trajectory computes
(tests/rollout/test_multi_turn.py measures the gap on both engines). Text is decoded only to *detect* a closed tool
call, never to rebuild ids.

Stop strings without engine support, in two phases per turn. While a turn has no open call, the stop token ids are
the vocabulary entries that contain the last piece of the start marker (``python`` of ```` ```python ````), so an
engine stops once a call may have opened; once the turn holds an open call they are the entries that contain the end
marker, so it stops right after the call closes. A stop that opened or closed nothing resumes generation in the same
turn. Stopping on the end marker from the start would also stop on every opening fence and on every stray ```` ``` ````
(a sample writing fences in a loop cost one engine call per two tokens: measured, 40+ rounds of one prompt); one
call per phase keeps the rounds few. Stops are only a saving: a call whose markers the stops missed (a marker split
across tokens, another tokenization) is still found when the turn ends (EOS or budget), and the turn is cut right
after the token that closed it: the tokens sampled after that are dropped, which keeps a sample (a prefix of a sample
is a sample of the same policy).

The action mask marks the model's own tokens (1) against tool output (0). Tool tokens carry a log-prob of 0.0 as a
placeholder that nothing may read: they are context, not actions. The reward reads the model's tokens only
(:func:`model_text`): a line the code printed is not the model's answer.

Weight versions: over an engine that tags its tokens (a rollout worker, ``RolloutOutput.token_versions``), each turn's
tokens keep the version of the weights that drew them, so a push that lands between two turns (or, with partial
rollouts, inside one) shows in the trajectory's versions. A trajectory's versions are those of its *model* tokens, in
order, and nothing for tool tokens: nobody sampled those, so they make no sample stale (``dapo.training.staleness``
reads the list as the versions of a sample's sampled tokens).

MoE routes (R3, ``actor.router_replay.mode``): over an engine that records them (``RolloutOutput.routed_experts``),
each call's routes are stitched onto the trajectory (dapo.rollout.sample_routes): a model token keeps the route of
the call that drew and fed it, a tool-output token the route of the next call's prefill, which read it as context
(as a single call routes its prompt), and the last token of a turn the next call's too (the turn's own call never
fed it). So every position of prompt + trajectory carries the expert ids the engine computed the later tokens from,
and the actor replays them at the same positions; a token no call fed (the last one, a tool output the budget ended
on) is -1 (routed live; it predicts no sampled token).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from dapo.rollout.base import RolloutEngine, RolloutOutput, SamplingParams
from dapo.rollout.sample_routes import routes_so_far, unfed_routes_appended
from dapo.tools.call_format import ToolCallFormat
from dapo.tools.toolbox import ToolCall, Toolbox

if TYPE_CHECKING:
    import torch

TruncateSide = Literal["left", "right", "middle"]


class ToolResultLike(Protocol):
    output: str
    category: str


class CodeRunner(Protocol):
    """A bare tool: runs codes (in parallel), results in input order (``dapo.tools``' sandbox); its call format is
    ``MultiTurnParams.call_format``. A :class:`~dapo.tools.toolbox.Toolbox` holds tools that carry their own."""

    def run_many(self, codes: Sequence[str], max_workers: int = ...) -> list[ToolResultLike]: ...


class _BareRunner:
    """A :class:`CodeRunner` with the params' call format: the one tool of a toolbox."""

    name = "runner"

    def __init__(self, runner: CodeRunner, call_format: ToolCallFormat) -> None:
        self.runner, self.call_format = runner, call_format

    def run_many(self, codes: Sequence[str], max_workers: int = 4) -> list[ToolResultLike]:
        return self.runner.run_many(codes, max_workers=max_workers)


@dataclass(frozen=True)
class MultiTurnParams:
    """The limits of one multi-turn rollout (verl: ``actor_rollout_ref.rollout.multi_turn.*``).

    max_assistant_turns: most model turns per sample; a call in the last turn is not run (the trajectory always ends
        on model tokens).
    max_response_length: the trajectory's token budget (model + tool tokens); reaching it ends the sample with
        finish reason "length".
    max_tool_response_length: most tokens of one tool output (cut on ``tool_response_truncate_side``, with a marker).
    max_parallel_calls: tool processes run at once.
    call_format: the call format of a bare :class:`CodeRunner` (tools of a toolbox carry their own), and what
        :meth:`MultiTurnRollout.tool_tokens` renders with when given no format.
    """

    max_assistant_turns: int = 3
    max_response_length: int = 256
    max_tool_response_length: int = 64
    tool_response_truncate_side: TruncateSide = "middle"
    max_parallel_calls: int = 4
    call_format: ToolCallFormat = field(default_factory=ToolCallFormat)

    def __post_init__(self) -> None:
        for name in ("max_assistant_turns", "max_response_length", "max_tool_response_length", "max_parallel_calls"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"multi_turn.{name} must be an integer >= 1, got {value!r}")
        if self.tool_response_truncate_side not in ("left", "right", "middle"):
            raise ValueError(
                "multi_turn.tool_response_truncate_side must be left, right or middle, "
                f"got {self.tool_response_truncate_side!r}"
            )


@dataclass
class MultiTurnOutput(RolloutOutput):
    """A :class:`RolloutOutput` whose responses are trajectories, with what the loss and the metrics need.

    action_mask: per token, 1 for a token the model sampled, 0 for a tool-output token (context, not an action).
    tool_calls: per sample, the tool calls that ran; tool_categories: per sample, each call's result category.
    turns: per sample, the model turns.
    token_versions (inherited): per sample, the version of each *model* token in order (one entry per 1 of
        ``action_mask``), when the engine tagged every call's tokens; None otherwise.
    routed_experts (inherited): per sample, ``[prompt + trajectory tokens, layers, k]`` expert ids, stitched over the
        calls (module docstring), when the engine recorded every call's routes; None otherwise.
    """

    action_mask: list[list[int]] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    tool_categories: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        for k, (ids, mask) in enumerate(zip(self.response_ids, self.action_mask, strict=True)):
            if len(ids) != len(mask):
                raise ValueError(f"MultiTurnOutput sample {k}: {len(ids)} ids but {len(mask)} mask entries")
        for k, (versions, mask) in enumerate(zip(self.token_versions or [], self.action_mask, strict=False)):
            if len(versions) != sum(mask):
                raise ValueError(f"MultiTurnOutput sample {k}: {len(versions)} versions but {sum(mask)} model tokens")

    @property
    def tool_calls(self) -> list[int]:
        return [len(c) for c in self.tool_categories]


@dataclass
class _Sample:
    prompt_index: int
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    versions: list[int] | None = field(default_factory=list)  # of the model tokens; None once a call came untagged
    # R3: the routes of prompt + ids as of the last call (tool tokens appended since have none yet); None before the
    # first call's, and for good once a call came without routes (unrouted)
    routes: torch.Tensor | None = None
    unrouted: bool = False
    turn_start: int = 0  # where the current model turn begins in ids
    turns: int = 1
    categories: list[str] = field(default_factory=list)
    finish: str | None = None
    pending_call: ToolCall | None = None


class MultiTurnRollout:
    """Runs multi-turn rollouts with ``engine`` and ``tools``; ``tokenizer`` decodes (to detect calls) and encodes
    tool outputs. One object per (engine, tokenizer): the stop-token scan of the vocabulary runs once. It is itself a
    :class:`RolloutEngine` (weights, probes and close go to ``engine``), so a trainer or an evaluation uses it in the
    engine's place.

    ``tools``: a :class:`~dapo.tools.toolbox.Toolbox` (each tool with its call format; a turn's call goes to the
    tool whose call closed first: dapo.rollout.tool_rollout builds it from the config), or one bare
    :class:`CodeRunner` whose format is ``params.call_format``. The stops are the union over the tools' formats."""

    def __init__(self, engine: RolloutEngine, tokenizer, tools: Toolbox | CodeRunner, params: MultiTurnParams) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.toolbox = tools if isinstance(tools, Toolbox) else Toolbox([_BareRunner(tools, params.call_format)])
        self.params = params
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
        ends, starts = zip(*(_stop_ids(tokenizer, texts, fmt) for fmt in self.toolbox.formats))
        self.end_token_ids = tuple(sorted(set().union(*ends)))
        self.start_token_ids = tuple(sorted(set().union(*starts)))

    # The rest of the RolloutEngine interface is the engine's: the trainer pushes weights into it and probes it.
    @property
    def weight_version(self) -> int:
        """The wrapped engine's weight version (one-step-off training tags the batch with it before generating)."""
        return self.engine.weight_version

    def update_weights(self, named_tensors) -> None:
        with self._own_deaths():
            self.engine.update_weights(named_tensors)

    def push_weights(self, named_tensors, version: int) -> dict[str, float]:
        """A versioned push into the wrapped engine (a rollout worker's: the tokens it draws afterwards carry
        ``version``); an engine without versioned pushes takes the weights as an update."""
        push = getattr(self.engine, "push_weights", None)
        with self._own_deaths():
            if push is None:
                self.engine.update_weights(named_tensors)
                return {}
            return push(named_tensors, version=version)

    @property
    def last_push(self) -> dict[str, float]:
        """The wrapped engine's last transfer metrics (a worker restarted mid-push reports them here)."""
        return getattr(self.engine, "last_push", {})

    def respawn(self) -> MultiTurnRollout:
        """This rollout over a new worker (the wrapped engine's ``respawn``): same tools, params and stop ids."""
        fresh = copy.copy(self)
        fresh.engine = self.engine.respawn()
        return fresh

    @contextlib.contextmanager
    def _own_deaths(self) -> Iterator[None]:
        """A dead worker under this rollout as this rollout's death: the run replaces the engine it holds, this
        object (``respawn``), and compares the death's handle with it."""
        # Here, not at the top: the worker module imports torch, and `dapo` must choose the OpenMP wait policy before
        # torch loads (dapo.cli.openmp); this module is imported on the way to that choice.
        from dapo.rollout.worker import RolloutWorkerDied

        try:
            yield
        except RolloutWorkerDied as death:
            if death.engine is self:
                raise
            raise RolloutWorkerDied(str(death), engine=self) from death  # type: ignore[arg-type]

    def log_probs_of(self, prompt_token_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        return self.engine.log_probs_of(prompt_token_ids, response_ids)

    def close(self) -> None:
        self.engine.close()

    def take_engine_counts(self) -> dict[str, float]:
        """The wrapped engines' per-engine sample counts (``EngineFleet``; every turn's continuations count), or none."""
        return getattr(self.engine, "take_engine_counts", dict)()

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> MultiTurnOutput:
        """Like :meth:`RolloutEngine.generate` (same order and ``n``); ``sampling.max_tokens`` is ignored in favour of
        the trajectory budget ``max_response_length``."""
        with self._own_deaths():
            return self._generate(prompt_token_ids, sampling)

    def _generate(self, prompt_token_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> MultiTurnOutput:
        samples = [_Sample(i, list(p)) for i, p in enumerate(prompt_token_ids) for _ in range(sampling.n)]
        stops = {
            open_: tuple(sorted(set(sampling.stop_token_ids) | set(ids)))
            for open_, ids in ((False, self.start_token_ids), (True, self.end_token_ids))
        }
        first = _replace(
            sampling, max_tokens=self.params.max_response_length, stop_token_ids=stops[self.toolbox.any_open("")]
        )
        self._absorb(samples, self.engine.generate([list(p) for p in prompt_token_ids], first))
        round_ = 1
        while True:
            self._run_tools([s for s in samples if s.pending_call is not None])
            if all(s.finish is not None for s in samples):
                break
            # One call per round and phase (turns without and with an open call stop on different ids), each
            # continuing sample its own prompt (n=1). The engine takes one max_tokens per call: the least room left,
            # so that no sample's prompt + max_tokens passes what the engine was sized for (vLLM's max_model_len); a
            # sample with more room that stops on "length" before its budget simply continues in the next round.
            for open_ in (False, True):
                active = [(k, s) for k, s in enumerate(samples) if s.finish is None and self._call_open(s) == open_]
                if not active:
                    continue
                budget = min(self.params.max_response_length - len(s.ids) for _, s in active)
                seeds = (
                    None
                    if sampling.prompt_seeds is None
                    else tuple(
                        (sampling.prompt_seeds[s.prompt_index] * 1_000_003 + k * 7919 + round_) % (1 << 63)
                        for k, s in active
                    )
                )
                params = _replace(
                    sampling,
                    n=1,
                    max_tokens=budget,
                    stop_token_ids=stops[open_],
                    seed=None if sampling.seed is None else sampling.seed + 2 * round_ + open_,
                    prompt_seeds=seeds,
                )
                out = self.engine.generate([s.prompt_ids + s.ids for _, s in active], params)
                self._absorb([s for _, s in active], out)
            round_ += 1
        return MultiTurnOutput(
            prompt_index=[s.prompt_index for s in samples],
            response_ids=[s.ids for s in samples],
            logprobs=[s.logprobs for s in samples],
            finish_reason=[s.finish for s in samples],
            action_mask=[s.mask for s in samples],
            turns=[s.turns for s in samples],
            tool_categories=[s.categories for s in samples],
            token_versions=None if any(s.versions is None for s in samples) else [s.versions for s in samples],
            routed_experts=None
            if any(s.unrouted or s.routes is None for s in samples)
            else [unfed_routes_appended(s.routes, len(s.prompt_ids) + len(s.ids)) for s in samples],  # type: ignore[arg-type]
        )

    # --- one engine call's results --------------------------------------------------------------------------------

    def _absorb(self, samples: list[_Sample], out: RolloutOutput) -> None:
        p = self.params
        tagged = out.token_versions or [None] * len(samples)
        routed = out.routed_experts or [None] * len(samples)
        for s, ids, lps, reason, versions, routes in zip(
            samples, out.response_ids, out.logprobs, out.finish_reason, tagged, routed, strict=True
        ):
            room = p.max_response_length - len(s.ids)
            ids, lps = list(ids[:room]), list(lps[:room])
            cut = self._closing_cut(s, ids)
            if cut is not None:
                ids, lps = ids[:cut], lps[:cut]
            s.ids += ids
            s.logprobs += lps
            s.mask += [1] * len(ids)
            # The kept tokens' versions (cut where the ids were); one untagged call leaves the trajectory untagged.
            s.versions = None if versions is None or s.versions is None else s.versions + list(versions[: len(ids)])
            # The call's routes over what it was given and drew, stitched on and cut where the ids were
            s.unrouted = s.unrouted or routes is None
            s.routes = None if s.unrouted else routes_so_far(s.routes, routes)[: len(s.prompt_ids) + len(s.ids)]
            full = len(s.ids) >= p.max_response_length
            if cut is not None:
                if s.turns < p.max_assistant_turns and not full:
                    s.pending_call = self.toolbox.first_closed_call(self._turn_text(s))
                else:  # no turn left to read the result: the call is not run
                    s.finish = "length" if full else "stop"
            elif full:
                s.finish = "length"
            elif reason == "stop" and ids and (ids[-1] in self.end_token_ids or ids[-1] in self.start_token_ids):
                continue  # stopped on a marker that closed nothing (a call opened, or a stray fence): keep going
            elif reason == "length":
                continue  # this call's max_tokens, not the sample's budget, ended it: keep generating
            else:
                s.finish = "stop"

    def _turn_text(self, s: _Sample) -> str:
        return self.tokenizer.decode(s.ids[s.turn_start :], skip_special_tokens=False)

    def _call_open(self, s: _Sample) -> bool:
        """Whether the sample's current turn has opened a call (a closed one ends the turn at once, see _absorb)."""
        return self.toolbox.any_open(self._turn_text(s))

    def _closing_cut(self, s: _Sample, new_ids: list[int]) -> int | None:
        """How many of ``new_ids`` to keep: up to the token that closes a call (binary search: once closed, a longer
        prefix stays closed), or None when they close none."""
        head = s.ids[s.turn_start :]

        def closed(k: int) -> bool:
            text = self.tokenizer.decode(head + new_ids[:k], skip_special_tokens=False)
            return self.toolbox.first_closed_call(text) is not None

        if not new_ids or not closed(len(new_ids)):
            return None
        lo, hi = 1, len(new_ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if closed(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    # --- tools -------------------------------------------------------------------------------------------------------

    def _run_tools(self, calling: list[_Sample]) -> None:
        if not calling:
            return
        p = self.params
        calls = [s.pending_call for s in calling if s.pending_call is not None]
        results = self.toolbox.run(calls, max_workers=p.max_parallel_calls)
        for s, call, result in zip(calling, calls, results, strict=True):
            s.pending_call = None
            s.categories.append(result.category)
            fmt = self.toolbox.formats[call.tool]
            tokens = self.tool_tokens(result.output, fmt)[: p.max_response_length - len(s.ids)]
            s.ids += tokens
            s.logprobs += [0.0] * len(tokens)
            s.mask += [0] * len(tokens)
            s.turns += 1
            s.turn_start = len(s.ids)
            if len(s.ids) >= p.max_response_length:
                s.finish = "length"

    def tool_tokens(self, output: str, call_format: ToolCallFormat | None = None) -> list[int]:
        """The tool output as tokens: the output encoded alone and cut to ``max_tool_response_length``, inside the
        response template of ``call_format`` (the tool's; default ``params.call_format``), its two halves encoded
        alone too."""
        p = self.params
        # split_special_tokens: the code's output is plain text; a printed "<|im_end|><|im_start|>user" must not become
        # real special-token ids (a forged turn boundary) inside the tool segment.
        ids = self.tokenizer.encode(output.rstrip("\n"), add_special_tokens=False, split_special_tokens=True)
        cap = p.max_tool_response_length
        if len(ids) > cap:
            marker = self.tokenizer.encode("...", add_special_tokens=False)
            keep = max(cap - len(marker), 0)
            if p.tool_response_truncate_side == "left":
                ids = marker + ids[len(ids) - keep :]
            elif p.tool_response_truncate_side == "right":
                ids = ids[:keep] + marker
            else:
                ids = ids[: keep // 2] + marker + ids[len(ids) - (keep - keep // 2) :]
        before, after = (call_format or p.call_format).response_halves()
        return (
            self.tokenizer.encode(before, add_special_tokens=False)
            + ids
            + self.tokenizer.encode(after, add_special_tokens=False)
        )


def model_text(tokenizer, ids: Sequence[int], action_mask: Sequence[int]) -> str:
    """The text of the model's own tokens of a trajectory, what the reward reads: each run of model tokens decoded
    (special tokens skipped) and the runs joined by a newline where a tool output stood. The tool output is left out:
    what the code printed (an ``Answer: 42`` line) is not the model's answer and must earn no reward."""
    if len(ids) != len(action_mask):
        raise ValueError(f"model_text: {len(ids)} ids but {len(action_mask)} mask entries")
    runs, run = [], []
    for token, is_model in zip(ids, action_mask):
        if is_model:
            run.append(int(token))
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return "\n".join(tokenizer.decode(r, skip_special_tokens=True) for r in runs)


def _stop_ids(tokenizer, texts: Sequence[str], fmt: ToolCallFormat) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The stop ids of one call format: (ids whose text holds the end marker, ids that may complete its start)."""
    end_ids = tuple(i for i, text in enumerate(texts) if fmt.end in text)
    # The start marker's last piece as the tokenizer writes it alone ("python" of "```python"): a token holding
    # it may complete the marker. Empty start (the turn is the call): always open, the end ids from the start.
    # A piece so common that more than 1% of the vocabulary holds it (a character-level tokenizer's "n") would
    # stop nearly every token: then no stop before a call opens, and the call is found when the turn ends.
    pieces = tokenizer.encode(fmt.start, add_special_tokens=False) if fmt.start else []
    last = tokenizer.decode(pieces[-1:], skip_special_tokens=False).strip() if pieces else ""
    holding = tuple(i for i, text in enumerate(texts) if last in text) if last else ()
    start_ids = end_ids if not fmt.start else holding if len(holding) <= max(1, len(texts) // 100) else ()
    return end_ids, start_ids


def _replace(sampling: SamplingParams, **changes) -> SamplingParams:
    return dataclasses.replace(sampling, **changes)
