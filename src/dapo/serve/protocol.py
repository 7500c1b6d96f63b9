"""The OpenAI wire format: parse and check request bodies, build response bodies and stream chunks.

Every malformed request is an :class:`APIError` carrying an HTTP status and an OpenAI-style body
``{"error": {"message", "type", "param", "code"}}``. Accepted and not honoured (documented in docs/serving.md):
``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``user`` and other keys the engine has no use for.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, type_: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class GenerationRequest:
    """One parsed request: what to sample and how to answer."""

    kind: str  # "chat" or "completion"
    model: str
    messages: list[dict[str, str]] | None = None
    prompts: list[str | list[int]] = field(default_factory=list)  # completions: text or token ids
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False
    prompt_logprobs: int | None = None  # vLLM's extension: per prompt position its token's (and k more) log-probs


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad("the request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise bad(f"the request body is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:  # json recurses per nesting level; an API body is a few levels deep
        raise bad("the request body is nested too deeply to be an API request") from None
    if not isinstance(data, dict):
        raise bad(f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _int(data: dict, key: str, default: int | None, low: int | None = None, high: int | None = None) -> int | None:
    value = data.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise bad(f"'{key}' must be an integer, got {_type_name(value)} {value!r:.40}", key)
    value = int(value)
    if low is not None and value < low:
        raise bad(f"'{key}' must be >= {low}, got {value}", key)
    if high is not None and value > high:
        raise bad(f"'{key}' must be <= {high}, got {value}", key)
    return value


def _float(data: dict, key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"'{key}' must be a number, got {_type_name(value)} {value!r:.40}", key)
    if value < low or (low_open and value == low) or value > high:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise bad(f"'{key}' must be in {interval}, got {value}", key)
    return float(value)


def _bool(data: dict, key: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"'{key}' must be a boolean, got {_type_name(value)}", key)
    return value


def _text(value: str, where: str) -> str:
    """``value`` if it is valid Unicode; JSON's ``\\ud800`` escapes can carry lone surrogates, which no tokenizer
    (and no UTF-8 encoder) accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad(
            f"'{where}' is not valid Unicode: a lone surrogate (\\u{ord(value[e.start]):04x}) at character {e.start}",
            where,
        ) from None
    return value


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return _text(content, where)
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(
                    f'\'{where}[{i}]\': only text content parts ({{"type": "text", "text": ...}}) are supported', where
                )
            parts.append(_text(part["text"], f"{where}[{i}].text"))
        return "".join(parts)
    raise bad(f"'{where}' must be a string or a list of text parts, got {_type_name(content)}", where)


def _messages(data: dict) -> list[dict[str, str]]:
    messages = data.get("messages")
    if messages is None:
        raise bad("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad(f"'messages' must be a non-empty array, got {_type_name(messages)}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"'messages[{i}]' must be an object, got {_type_name(m)}", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad(f"'messages[{i}].role' must be one of {sorted(ROLES)}, got {role!r:.40}", f"messages[{i}].role")
        if role == "developer":
            role = "system"
        out.append({"role": role, "content": _content_text(m.get("content"), f"messages[{i}].content")})
    return out


def _prompts(data: dict) -> list[str | list[int]]:
    prompt = data.get("prompt")
    if prompt is None:
        raise bad("'prompt' is required", "prompt")
    if isinstance(prompt, str):
        return [_text(prompt, "prompt")]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [_text(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(
            isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt
        ):
            return [list(p) for p in prompt]
    raise bad(
        "'prompt' must be a string, an array of strings, an array of token ids or an array of such arrays", "prompt"
    )


def _stop(data: dict) -> list[str]:
    stop = data.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad(f"'stop' must be a string or an array of strings, got {_type_name(stop)}", "stop")
    if len(stop) > MAX_STOP:
        raise bad(f"'stop' has {len(stop)} sequences; at most {MAX_STOP}", "stop")
    return [_text(s, "stop") for s in stop if s]


def parse_request(
    kind: str, data: dict[str, Any], *, max_n: int, max_sequences: int | None = None
) -> GenerationRequest:
    """Check one request body; raises :class:`APIError` (400) naming the first bad field. ``max_sequences`` bounds
    prompts x n (the sequences one request may make the server decode)."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required and must be a string", "model")
    req = GenerationRequest(kind=kind, model=_text(model, "model"))
    if kind == "chat":
        req.messages = _messages(data)
    else:
        req.prompts = _prompts(data)
    req.n = _int(data, "n", 1, 1, max_n)
    rows = len(req.prompts or [None]) * req.n
    if max_sequences is not None and rows > max_sequences:
        raise bad(
            f"this request asks for {len(req.prompts or [None])} prompt(s) x n={req.n} = {rows} sequences; this "
            f"server decodes at most {max_sequences} per request (split it, or raise max_sequences_per_request)",
            "prompt" if len(req.prompts) > 1 else "n",
            "too_many_sequences",
        )
    req.temperature = _float(data, "temperature", 1.0, 0.0, 2.0)
    req.top_p = _float(data, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _int(data, "top_k", -1, -1)
    req.top_k = -1 if top_k == 0 else top_k
    max_tokens = _int(data, "max_tokens", None, 1)
    max_completion = _int(data, "max_completion_tokens", None, 1)
    req.max_tokens = max_completion if max_completion is not None else max_tokens
    req.stop = _stop(data)
    seed = _int(data, "seed", None)
    req.seed = None if seed is None else seed % (2**63)
    req.stream = _bool(data, "stream", False)
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad("'stream_options' must be an object", "stream_options")
        req.include_usage = _bool(options, "include_usage", False)
    if kind == "chat":
        req.logprobs = _bool(data, "logprobs", False)
        req.top_logprobs = _int(data, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    else:
        value = _int(data, "logprobs", None, 0, 5)
        req.logprobs = value is not None
        req.top_logprobs = value or 0
        req.echo = _bool(data, "echo", False)
        if req.echo:
            raise bad("'echo' is not supported; for the prompt's log-probs use 'prompt_logprobs' (vLLM's form)", "echo")
        req.prompt_logprobs = _int(data, "prompt_logprobs", None, 0, MAX_TOP_LOGPROBS)
        if req.prompt_logprobs is not None and req.stream:
            raise bad("'prompt_logprobs' is not supported with 'stream'", "prompt_logprobs")
    for key in ("presence_penalty", "frequency_penalty"):
        _float(data, key, 0.0, -2.0, 2.0)
    return req


# ------------------------------------------------------------------------------------------------ responses
@dataclass
class Choice:
    """One finished sample, ready to be written out."""

    text: str
    finish_reason: str
    token_ids: list[int]
    token_texts: list[str]
    logprobs: list[float]
    top: list[list[tuple[str, float]]] | None = None  # per token, the most likely tokens and their log-probs
    # ``prompt_logprobs``: None for the first prompt token, then per position {token id: {logprob, rank,
    # decoded_token}} holding the position's own token and the k most likely ones (vLLM's layout)
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chat_logprobs(choice: Choice, top: int) -> dict[str, Any]:
    content = []
    for i, (text, lp) in enumerate(zip(choice.token_texts, choice.logprobs)):
        entry = {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}
        if top > 0 and choice.top is not None:
            entry["top_logprobs"] = [
                {"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))} for t, v in choice.top[i][:top]
            ]
        else:
            entry["top_logprobs"] = [dict(entry)] if top > 0 else []
        content.append(entry)
    return {"content": content, "refusal": None}


def _completion_logprobs(choice: Choice, top: int) -> dict[str, Any]:
    offsets, at = [], 0
    for text in choice.token_texts:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": list(choice.token_texts),
        "token_logprobs": list(choice.logprobs),
        "top_logprobs": (
            None
            if top <= 0
            else [{t: lp} for t, lp in zip(choice.token_texts, choice.logprobs)]
            if choice.top is None
            else [dict(alternatives[:top]) for alternatives in choice.top]
        ),
        "text_offset": offsets,
    }


def response_body(
    req: GenerationRequest, model: str, request_id: str, choices: list[Choice], prompt_tokens: int
) -> dict[str, Any]:
    created = int(time.time())
    completion_tokens = sum(len(c.token_ids) for c in choices)
    out_choices = []
    for i, c in enumerate(choices):
        if req.kind == "chat":
            out_choices.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": _chat_logprobs(c, req.top_logprobs) if req.logprobs else None,
                    "finish_reason": c.finish_reason,
                }
            )
        else:
            out_choices.append(
                {
                    "index": i,
                    "text": c.text,
                    "logprobs": _completion_logprobs(c, req.top_logprobs) if req.logprobs else None,
                    "finish_reason": c.finish_reason,
                    **({} if req.prompt_logprobs is None else {"prompt_logprobs": c.prompt_logprobs}),
                }
            )
    return {
        "id": request_id,
        "object": "chat.completion" if req.kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": out_choices,
        "system_fingerprint": None,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode("utf-8")


class StreamChunks:
    """The server-sent events of one streamed answer, built as its tokens arrive: per choice a role chunk (chat),
    content deltas, a finish chunk; then usage (``stream_options.include_usage``) and ``[DONE]``."""

    def __init__(self, req: GenerationRequest, model: str, request_id: str) -> None:
        self.req = req
        self.model = model
        self.request_id = request_id
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {
            "id": self.request_id,
            "object": self.obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.req.include_usage:
            body["usage"] = None
        body.update(extra)
        return sse(body)

    def start(self, index: int) -> bytes | None:
        if self.req.kind != "chat":
            return None
        return self._chunk(
            [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
        )

    def delta(self, index: int, text: str, token_texts: list[str], logprobs: list[float]) -> bytes:
        piece = Choice(text, "", [0] * len(token_texts), token_texts, logprobs)
        if self.req.kind == "chat":
            lps = _chat_logprobs(piece, self.req.top_logprobs) if self.req.logprobs else None
            return self._chunk([{"index": index, "delta": {"content": text}, "logprobs": lps, "finish_reason": None}])
        lps = _completion_logprobs(piece, self.req.top_logprobs) if self.req.logprobs else None
        return self._chunk([{"index": index, "text": text, "logprobs": lps, "finish_reason": None}])

    def finish(self, index: int, reason: str) -> bytes:
        if self.req.kind == "chat":
            return self._chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}])
        return self._chunk([{"index": index, "text": "", "logprobs": None, "finish_reason": reason}])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes | None:
        if not self.req.include_usage:
            return None
        return self._chunk([], usage=usage(prompt_tokens, completion_tokens))

    @staticmethod
    def done() -> bytes:
        return sse("[DONE]")
