"""Where evaluation samples come from: a local rollout engine, or any OpenAI-compatible server.

* :class:`LocalBackend` wraps a :class:`dapo.rollout.base.RolloutEngine` (the HF engine, or vLLM through
  :func:`dapo.rollout.factory.build_rollout_engine`) and the tokenizer whose chat template turns messages into tokens.
* :class:`OpenAIBackend` sends ``POST {base_url}/chat/completions`` requests (one per sample, ``n=1``, a per-sample
  seed) with at most ``concurrency`` in flight, and retries 408/429/5xx answers, time-outs and connection errors with
  exponential back-off (honouring ``Retry-After``). Any other 4xx stops the evaluation with the server's message. A
  server that cannot be reached at all gives an :class:`EvalError` naming the URL.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dapo.rollout.base import RolloutEngine, SamplingParams
from dapo.rollout.multi_turn import model_text

RETRY_STATUS: frozenset[int] = frozenset({408, 429, 500, 502, 503, 504})


class EvalError(RuntimeError):
    """Evaluation cannot go on; the message says why and what to change."""


@dataclass(frozen=True)
class Generated:
    """One sampled response."""

    text: str
    finish_reason: str
    prompt_tokens: int
    response_tokens: int
    tool_calls: tuple[str, ...] | None = None  # multi-turn: each tool call's result category, in order
    # multi-turn: the model's own tokens' text (tool outputs left out), what the reward scores; None: ``text``
    model_text: str | None = None

    @property
    def scored_text(self) -> str:
        """What the reward reads: the model's text, never what a tool printed."""
        return self.text if self.model_text is None else self.model_text


def encode_messages(tokenizer, messages: Sequence[dict[str, str]]) -> list[int]:
    """Chat template applied, generation prompt added, as token ids (as ``dapo.data.prompts.encode_prompts`` does)."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "input_ids") or isinstance(ids, dict):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def decode_response(tokenizer, ids: Sequence[int]) -> str:
    """Response text without special tokens (the stop token is not shown)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


class LocalBackend:
    """Samples with an in-process engine. ``generate`` is synchronous and batches many prompts in one engine call.

    The engine may be a multi-turn rollout (:class:`dapo.rollout.multi_turn.MultiTurnRollout`): a response is then the
    whole trajectory (model and tool tokens) and carries its tool calls; the reward scores its ``model_text``, the
    model's tokens only (as in training)."""

    name = "local"

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer,
        *,
        max_prompt_length: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.max_model_len = max_model_len  # the model's context (max_position_embeddings), None = unknown

    def encode(self, messages: Sequence[dict[str, str]]) -> list[int]:
        ids = encode_messages(self.tokenizer, messages)
        if self.max_prompt_length is not None and len(ids) > self.max_prompt_length:
            raise EvalError(f"a prompt has {len(ids)} tokens, more than --max-prompt-length {self.max_prompt_length}")
        return ids

    def generate(
        self, prompts: Sequence[Sequence[dict[str, str]]], counts: Sequence[int], params: SamplingParams
    ) -> list[list[Generated]]:
        """``counts[i]`` samples for prompt ``i`` (``params.n`` is ignored), in one engine call."""
        if not prompts:
            return []
        encoded = [self.encode(m) for m in prompts]
        n = math.gcd(*counts)
        rows: list[list[int]] = []
        owner: list[int] = []
        for i, (ids, count) in enumerate(zip(encoded, counts)):
            for _ in range(count // n):
                rows.append(ids)
                owner.append(i)
        out = self.engine.generate(
            rows,
            SamplingParams(
                n=n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=params.max_tokens,
                stop_token_ids=params.stop_token_ids,
                seed=params.seed,
            ),
        )
        results: list[list[Generated]] = [[] for _ in prompts]
        tool_categories = getattr(out, "tool_categories", None)
        action_masks = getattr(out, "action_mask", None)
        for k in range(len(out)):
            i = owner[out.prompt_index[k]]
            ids = out.response_ids[k]
            calls = None if tool_categories is None else tuple(tool_categories[k])
            own = None if action_masks is None else model_text(self.tokenizer, ids, action_masks[k])
            results[i].append(
                Generated(
                    decode_response(self.tokenizer, ids), out.finish_reason[k], len(encoded[i]), len(ids), calls, own
                )
            )
        return results

    def close(self) -> None:
        self.engine.close()


def normalize_base_url(url: str) -> str:
    """``http://host:port`` and ``http://host:port/`` become ``http://host:port/v1``; other paths are kept."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise EvalError(f"--base-url {url!r}: expected an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1")
    rest = url.split("://", 1)[1]
    if "/" not in rest:
        url += "/v1"
    return url


class OpenAIBackend:
    """Samples from an OpenAI-compatible server (``dapo serve``, ``vllm serve``, ...). Use as an async context."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None,
        *,
        concurrency: int = 64,
        max_retries: int = 6,
        timeout_s: float = 600.0,
        backoff_s: float = 0.5,
        api_key: str | None = None,
        transport: Any = None,
    ) -> None:
        if concurrency < 1:
            raise EvalError(f"--concurrency must be >= 1, got {concurrency}")
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.api_key = api_key or "EMPTY"
        self.transport = transport  # an httpx transport (tests)
        self._client = None
        self._semaphore: asyncio.Semaphore | None = None
        self.max_model_len: int | None = None  # the served model's context, where /models lists it (vLLM, dapo serve)

    async def __aenter__(self) -> OpenAIBackend:
        import httpx

        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        self._client = httpx.AsyncClient(
            timeout=self.timeout_s,
            limits=limits,
            headers={"Authorization": f"Bearer {self.api_key}"},
            transport=self.transport,
        )
        self._semaphore = asyncio.Semaphore(self.concurrency)
        await self._resolve_model()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        import httpx

        assert self._client is not None, "use OpenAIBackend as `async with`"
        url = f"{self.base_url}{path}"
        last = ""
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            try:
                response = await self._client.request(method, url, json=payload)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                connect_failed = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
            else:
                connect_failed = False
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError:
                        raise EvalError(
                            f"{url} answered {response.status_code} with a body that is not JSON: "
                            f"{response.text[:200]!r}"
                        ) from None
                message = _error_message(response)
                if response.status_code not in RETRY_STATUS:
                    raise EvalError(f"{url} answered {response.status_code}: {message}")
                last = f"HTTP {response.status_code}: {message}"
                retry_after = _retry_after(response.headers.get("retry-after"))
            if attempt == self.max_retries:
                break
            delay = retry_after if retry_after is not None else self.backoff_s * (2**attempt)
            await asyncio.sleep(min(delay, 30.0) * (1.0 + 0.1 * random.random()))
        if connect_failed:
            raise EvalError(
                f"cannot reach the server at {self.base_url} ({last}); is it running? Start one with "
                f"`dapo serve MODEL` or check --base-url"
            )
        raise EvalError(f"{url} failed after {self.max_retries + 1} attempts; last error: {last}")

    async def _resolve_model(self) -> None:
        listing = await self._request("GET", "/models")
        entries = [m for m in listing.get("data", []) if isinstance(m, dict)]
        names = [m.get("id") for m in entries]
        if self.model is None:
            if not names:
                raise EvalError(f"{self.base_url}/models lists no model; pass --model")
            self.model = names[0]
        served = next((m for m in entries if m.get("id") == self.model), {})
        length = served.get("max_model_len")
        self.max_model_len = length if isinstance(length, int) and length > 0 else None

    def probe(self) -> None:
        """Ask the server, before the run, which model it serves (``model`` when not given) and its context
        (``max_model_len``), so the output file is named after it and the response budget fits it."""

        async def listed() -> None:
            async with self:
                pass

        asyncio.run(listed())

    async def complete(self, messages: Sequence[dict[str, str]], params: SamplingParams) -> Generated:
        assert self._semaphore is not None, "use OpenAIBackend as `async with`"
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "n": 1,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_completion_tokens": params.max_tokens,
        }
        if params.seed is not None:
            payload["seed"] = params.seed
        if params.top_k not in (-1, 0):
            payload["top_k"] = params.top_k  # vLLM and dapo serve accept it; OpenAI ignores unknown sampling keys
        async with self._semaphore:
            body = await self._request("POST", "/chat/completions", payload)
        try:
            choice = body["choices"][0]
            usage = body.get("usage") or {}
            text = choice["message"].get("content") or ""
            return Generated(
                text,
                str(choice.get("finish_reason") or "stop"),
                int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)),
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise EvalError(
                f"{self.base_url}/chat/completions answered an unexpected body ({e}): {str(body)[:200]}"
            ) from None


def _error_message(response) -> str:
    try:
        body = response.json()
        error = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(error)
    except ValueError:
        return response.text[:200]


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
