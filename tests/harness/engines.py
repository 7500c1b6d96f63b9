"""The tests' scripted rollout engine: answers written in advance instead of sampled from a model, so that a test
can hand-count tokens, rewards and calls."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from dapo.rollout.base import RolloutOutput, SamplingParams

# The uncut answers of one call, one per row in the engines' layout (prompt by prompt, ``params.n`` rows each).
Respond = Callable[[Sequence[Sequence[int]], SamplingParams], Sequence[Sequence[int]]]


def _no_step(rows: list[int], tokens: list[int], logprobs: list[float]) -> bool:
    return False


class ScriptedEngine:
    """A rollout engine whose answers come from ``respond(prompts, params)`` (one token list per row) and are cut as an
    engine cuts a sample: after the first stop token (``stop_tokens`` and the call's ``params.stop_token_ids``) and at
    ``params.max_tokens``. A row ends "stop" on a stop token or where its script ends (a model that stopped by
    itself), "length" where ``max_tokens`` or a streaming caller cut it; every token has log-prob ``logprob``.

    ``resume_by``: rows whose prompts have the same key go on where that key's last row stopped, as a conversation
    does whose prompt grows by tool output between calls (``respond`` then gives the key's whole script).

    It reports its decode steps as the Transformers engine does (:class:`dapo.rollout.base.TokenStreamingEngine`),
    records each call's (number of prompts, stop ids) in ``calls``, and ``closed`` once closed.
    """

    def __init__(
        self,
        respond: Respond,
        *,
        stop_tokens: Sequence[int] = (),
        logprob: float = -0.1,
        resume_by: Callable[[Sequence[int]], Hashable] | None = None,
    ) -> None:
        self.respond, self.stop_tokens, self.logprob, self.resume_by = respond, tuple(stop_tokens), logprob, resume_by
        self.calls: list[tuple[int, tuple[int, ...]]] = []
        self.closed = False
        self._cursor: dict[Hashable, int] = {}

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> RolloutOutput:
        return self.generate_streaming(prompt_token_ids, params, _no_step)

    def generate_streaming(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        params: SamplingParams,
        on_step: Callable[[list[int], list[int], list[float]], bool],
    ) -> RolloutOutput:
        self.calls.append((len(prompt_token_ids), tuple(params.stop_token_ids)))
        rows = [i for i in range(len(prompt_token_ids)) for _ in range(params.n)]
        scripts = list(self.respond(prompt_token_ids, params))
        assert len(scripts) == len(rows), f"the script gave {len(scripts)} answers for {len(rows)} rows"
        stops = set(self.stop_tokens) | set(params.stop_token_ids)
        keys = [self.resume_by(prompt_token_ids[i]) if self.resume_by else None for i in rows]
        answers, reasons = [], []
        for key, script in zip(keys, scripts):
            answer = self._cut(list(script)[self._cursor.get(key, 0) :], stops, params.max_tokens)
            answers.append(answer)
            reasons.append("stop" if (answer and answer[-1] in stops) or len(answer) < params.max_tokens else "length")
            if self.resume_by:
                self._cursor[key] = self._cursor.get(key, 0) + len(answer)
        for step in range(max((len(a) for a in answers), default=0)):
            live = [k for k, a in enumerate(answers) if step < len(a)]
            if on_step(live, [answers[k][step] for k in live], [self.logprob] * len(live)):
                reasons = [r if len(a) <= step + 1 else "length" for a, r in zip(answers, reasons)]
                answers = [a[: step + 1] for a in answers]
                break
        return RolloutOutput(rows, answers, [[self.logprob] * len(a) for a in answers], reasons)

    @staticmethod
    def _cut(script: list[int], stops: set[int], max_tokens: int) -> list[int]:
        for k, token in enumerate(script[:max_tokens]):
            if token in stops:
                return script[: k + 1]
        return script[:max_tokens]

    def update_weights(self, named_tensors) -> None:
        pass

    def log_probs_of(self, prompt_token_ids, response_ids) -> list[float]:
        return [0.0] * len(response_ids)

    def close(self) -> None:
        self.closed = True
