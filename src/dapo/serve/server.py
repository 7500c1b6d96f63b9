"""The OpenAI-compatible server logic, independent of how it is hosted (a Ray Serve replica, or plain FastAPI).

:class:`OpenAIServer` loads the model, builds the engine through :func:`dapo.rollout.factory.build_rollout_engine`
(HF, or vLLM), wraps it in a :class:`dapo.serve.batching.BatchingEngine`, and answers

* ``POST /v1/chat/completions`` and ``POST /v1/completions`` (``stream``, ``n``, ``logprobs``, ``stop``, ``seed``,
  ``max_tokens`` / ``max_completion_tokens``, ``usage``),
* ``GET /v1/models`` and ``GET /health``.

Nothing a client sends can crash it: every handler turns a bad request into a 4xx and any other failure into a 500
with an OpenAI-style error body, and the next request is served as usual.
"""

import functools
import logging
import os
import time

from dapo.rollout.base import SamplingParams
from dapo.rollout.spec import EngineSpec
from dapo.serve.batching import BatchingEngine
from dapo.serve.config import ServeConfig
from dapo.serve.protocol import (
    APIError,
    Choice,
    GenerationRequest,
    bad,
    new_id,
    parse_json,
    parse_request,
    StreamChunks,
    response_body,
    sse,
)
from dapo.serve.stream_text import StreamedChoice
from dapo.serve.uploads import UploadSlots, read_body

log = logging.getLogger(__name__)


def load_engine(cfg: ServeConfig):
    """(engine, tokenizer, max_model_len, backend name) for a config (``dapo.rollout.loaded_engine``)."""
    import torch

    from dapo.config import ModelConfig
    from dapo.rollout.loaded_engine import load_model_engine

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    spec = EngineSpec(
        name=cfg.backend,
        seed=cfg.seed,
        max_model_len=cfg.max_model_len,
        max_batch_size=cfg.max_batch_rows,
        tensor_parallel_size=cfg.tensor_parallel_size,
    )
    loaded = load_model_engine(ModelConfig(path=cfg.model), spec, device=cfg.device)
    return loaded.engine, loaded.tokenizer, loaded.spec.max_model_len, loaded.spec.name


class OpenAIServer:
    """Answers OpenAI API requests for one model. ``engine``/``tokenizer`` may be given (tests), else loaded."""

    def __init__(self, cfg: ServeConfig, *, engine=None, tokenizer=None, max_model_len: int | None = None) -> None:
        self.cfg = cfg
        if engine is None:
            engine, tokenizer, max_model_len, self.backend = load_engine(cfg)
        else:
            self.backend = "custom"
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len or cfg.max_model_len or 4096
        self.batcher = BatchingEngine(
            engine,
            max_batch_rows=cfg.max_batch_rows,
            batch_wait_s=cfg.batch_wait_ms / 1000,
            max_rows_per_request=cfg.max_batch_rows_per_request,
            chunk_tokens=cfg.decode_chunk_tokens,
        )
        self.created = int(time.time())
        self.names = {cfg.model_name}
        if cfg.model:
            self.names.add(cfg.model)
        self.vocab_size = len(tokenizer)
        self.uploads = UploadSlots(cfg.max_unfinished_uploads)

    # ------------------------------------------------------------------------------------------------ routes
    async def health(self, request=None):
        from starlette.responses import JSONResponse

        return JSONResponse(
            {
                "status": "ok",
                "model": self.cfg.model_name,
                "backend": self.backend,
                "pid": os.getpid(),
                "active_requests": self.batcher.active_requests,
                "engine_calls": self.batcher.engine_calls,
            }
        )

    async def models(self, request=None):
        from starlette.responses import JSONResponse

        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.cfg.model_name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "dapo",
                        "root": self.cfg.model or self.cfg.model_name,
                        "max_model_len": self.max_model_len,
                    }
                ],
            }
        )

    async def chat(self, request):
        return await self._handle("chat", request)

    async def completions(self, request):
        return await self._handle("completion", request)

    # ------------------------------------------------------------------------------------------------ internals
    async def _handle(self, kind: str, request):
        from starlette.responses import JSONResponse, StreamingResponse

        try:
            body = await self._read_body(request)
            req = parse_request(
                kind, parse_json(body), max_n=self.cfg.max_n, max_sequences=self.cfg.max_sequences_per_request
            )
            if req.model not in self.names:
                raise APIError(
                    404,
                    f"The model '{req.model}' does not exist; this server serves '{self.cfg.model_name}'",
                    param="model",
                    code="model_not_found",
                )
            prompts = self._encode(req)
            params = self._params(req, max(len(p) for p in prompts))
            prompt_tokens = sum(len(p) for p in prompts)
            rid = new_id(kind)
            if req.stream:
                return StreamingResponse(
                    self._stream(req, prompts, params, rid, prompt_tokens),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            outputs = await self.batcher.generate(prompts, params, stopped=self._stop_check(req))
            choices = [self._choice(req, ids, lps, reason) for per_prompt in outputs for ids, lps, reason in per_prompt]
            if req.logprobs and req.top_logprobs > 0:
                rows = [prompts[p] for p, per_prompt in enumerate(outputs) for _ in per_prompt]
                await self.batcher.run_on_engine(lambda: self._add_top_logprobs(req, rows, choices))
            if req.prompt_logprobs is not None:
                owners = [p for p, per_prompt in enumerate(outputs) for _ in per_prompt]
                scored = await self.batcher.run_on_engine(lambda: self._prompt_logprobs(req, prompts))
                for choice, p in zip(choices, owners):
                    choice.prompt_logprobs = scored[p]
            return JSONResponse(response_body(req, self.cfg.model_name, rid, choices, prompt_tokens))
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        except Exception as e:  # never let a request take the server down
            log.exception("request failed")
            err = APIError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
            return JSONResponse(err.body(), status_code=500)

    async def _stream(
        self, req: GenerationRequest, prompts: list[list[int]], params: SamplingParams, rid: str, prompt_tokens: int
    ):
        """Server-sent events as the batcher decodes: one content chunk per token, the text it adds
        (:class:`dapo.serve.stream_text.StreamedChoice`), sent the step the engine draws it (the Transformers engine;
        vLLM's tokens come when its call returns). A token whose text is incomplete (part of a character) or could be
        the start of a stop string sends nothing; its text goes out with the next token that settles it. Closing the
        stream (the client went away) cancels the request, which leaves the batch after the step under way."""
        import asyncio

        chunks = StreamChunks(req, self.cfg.model_name, rid)
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(
            self.batcher.generate(prompts, params, on_progress=queue.put_nowait, stopped=self._stop_check(req))
        )
        task.add_done_callback(lambda _: queue.put_nowait(None))
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=True)
        rows: dict[int, StreamedChoice] = {}
        finals: dict[int, Choice] = {}
        try:
            for i in range(len(prompts) * req.n):
                start = chunks.start(i)
                if start is not None:
                    yield start
            while (item := await queue.get()) is not None:
                p, s, ids, lps, finish = item
                i = p * req.n + s
                if i in finals:  # ended here by a stop string; the batch learns of it at the end of its call
                    continue
                row = rows.setdefault(i, StreamedChoice(decode, req.stop))
                for token, logprob in zip(ids, lps):
                    out = row.push(token, logprob)
                    if out is not None:
                        yield chunks.delta(i, out[0], [decode([t]) for t in out[1]], out[2])
                    if row.stopped:
                        finish = "stop"
                        break
                if finish is None:
                    continue
                final = finals[i] = self._choice(req, row.ids, row.logprobs, finish)
                text, rest_ids, rest_lps = row.finish(final.text, final.token_ids, final.logprobs)
                if text or (req.logprobs and rest_ids):
                    yield chunks.delta(i, text, [decode([t]) for t in rest_ids], rest_lps)
                yield chunks.finish(i, final.finish_reason)
            task.result()  # an engine failure: reported below
            completion_tokens = sum(len(final.token_ids) for final in finals.values())
            tail = chunks.usage(prompt_tokens, completion_tokens)
            if tail is not None:
                yield tail
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("stream failed")
            err = APIError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error")
            yield sse(err.body())
        finally:
            if not task.done():
                task.cancel()
        yield chunks.done()

    def _add_top_logprobs(self, req: GenerationRequest, prompts: list[list[int]], choices: list[Choice]) -> None:
        """Each token's ``top_logprobs`` most likely alternatives, from one teacher-forced forward pass over prompt +
        response: log_softmax(logits / temperature) over the full vocabulary (temperature 1 when greedy), the
        distribution the sampled token's own log-prob comes from when top-k/top-p are off. HF backend only; other
        engines list the sampled token alone."""
        import torch

        model = getattr(self.engine, "model", None)
        if not isinstance(model, torch.nn.Module):
            return
        device = next(model.parameters()).device
        scale = req.temperature if req.temperature > 0 else 1.0
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                for prompt, choice in zip(prompts, choices):
                    if not choice.token_ids:
                        choice.top = []
                        continue
                    ids = torch.tensor([prompt + choice.token_ids], device=device)
                    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
                    values, indices = torch.log_softmax(logits / scale, dim=-1).topk(req.top_logprobs, dim=-1)
                    decode = self.tokenizer.decode
                    choice.top = [
                        [(decode([t], skip_special_tokens=True), v) for t, v in zip(ts, vs)]
                        for ts, vs in zip(indices.tolist(), values.tolist())
                    ]
        finally:
            model.train(was_training)

    def _prompt_logprobs(self, req: GenerationRequest, prompts: list[list[int]]) -> list[list]:
        """vLLM's ``prompt_logprobs`` of each prompt: per position after the first, its token's log-prob and rank and
        the ``req.prompt_logprobs`` most likely tokens, from one teacher-forced forward at temperature 1 through the
        actor's log-prob helper (what a distillation teacher serves, dapo.distillation.served_teacher). HF backend
        only."""
        import torch

        from dapo.actor.batch import TrainBatch
        from dapo.actor.log_probs import compute_response_log_probs

        model = getattr(self.engine, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise bad(
                f"'prompt_logprobs' needs the Transformers backend (this server runs {self.backend}); for vLLM "
                "use `vllm serve`, which answers it itself",
                "prompt_logprobs",
            )
        k = req.prompt_logprobs or 0
        decode = self.tokenizer.decode
        out = []
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                for prompt in prompts:
                    if len(prompt) < 2:
                        out.append([None] * len(prompt))
                        continue
                    batch = TrainBatch(
                        prompt_ids=[prompt[:1]],
                        response_ids=[prompt[1:]],
                        advantages=torch.zeros(1),
                        sample_mask=torch.ones(1, dtype=torch.bool),
                        group_index=torch.zeros(1, dtype=torch.long),
                    )
                    vocab = int(model.get_input_embeddings().num_embeddings)
                    everything = [torch.arange(vocab).expand(len(prompt) - 1, vocab)] if k else None
                    (row,), _ = compute_response_log_probs(
                        model,
                        batch,
                        temperature=1.0,
                        chunk_size=1024,
                        with_entropy=False,
                        layout="padded",
                        **({"gather_ids": everything} if k else {}),
                    )
                    row = row.float().cpu()
                    own = row if not k else row[:, 0]
                    positions: list = [None]
                    for j, token in enumerate(prompt[1:]):
                        entry = {}
                        if k:
                            full = row[j, 1:]
                            rank = int((full > own[j]).sum()) + 1
                            values, ids = full.topk(k)
                            for r, (v, t) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
                                entry[str(t)] = {"logprob": v, "rank": r, "decoded_token": decode([t])}
                        else:
                            rank = None
                        entry[str(token)] = {"logprob": float(own[j]), "rank": rank, "decoded_token": decode([token])}
                        positions.append(entry)
                    out.append(positions)
        finally:
            model.train(was_training)
        return out

    def _stop_check(self, req: GenerationRequest):
        if not req.stop:
            return None
        decode = self.tokenizer.decode

        def hit(prompt: int, sample: int, tokens: list[int]) -> bool:
            text = decode(tokens, skip_special_tokens=True)
            return any(stop in text for stop in req.stop)

        return hit

    async def _read_body(self, request) -> bytes:
        """The whole body, within the bounds of :mod:`dapo.serve.uploads` (``serve run`` has no front door to hold
        requests to them; behind ``dapo serve``'s front the body arrives whole and this never refuses)."""
        return await read_body(request.stream(), request.headers.get("content-length"), self.cfg, self.uploads)

    def _encode(self, req: GenerationRequest) -> list[list[int]]:
        if req.kind == "chat":
            try:
                ids = self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True)
            except Exception as e:
                raise bad(f"the messages cannot be put through the model's chat template: {e}", "messages") from None
            if hasattr(ids, "input_ids") or isinstance(ids, dict):
                ids = ids["input_ids"]
            prompts = [[int(t) for t in ids]]
        else:
            prompts = []
            for i, p in enumerate(req.prompts):
                if isinstance(p, str):
                    ids = self.tokenizer(p, add_special_tokens=False)["input_ids"]
                else:
                    if any(t < 0 or t >= self.vocab_size for t in p):
                        raise bad(
                            f"'prompt' {i} has a token id outside the vocabulary [0, {self.vocab_size})", "prompt"
                        )
                    ids = p
                prompts.append([int(t) for t in ids])
        for i, ids in enumerate(prompts):
            if not ids:
                raise bad(f"prompt {i} is empty after tokenisation", "prompt" if req.kind != "chat" else "messages")
            if len(ids) >= self.max_model_len:
                raise bad(
                    f"prompt {i} has {len(ids)} tokens; this model's maximum context length is "
                    f"{self.max_model_len} tokens",
                    "messages" if req.kind == "chat" else "prompt",
                    "context_length_exceeded",
                )
        return prompts

    def _params(self, req: GenerationRequest, longest_prompt: int) -> SamplingParams:
        room = self.max_model_len - longest_prompt
        if req.max_tokens is None:
            max_tokens = max(1, min(self.cfg.default_max_tokens, room))
        else:
            max_tokens = req.max_tokens
            if max_tokens > self.cfg.max_tokens_limit:
                raise bad(
                    f"'max_tokens' is {max_tokens}; this server allows at most {self.cfg.max_tokens_limit}",
                    "max_tokens",
                )
            if max_tokens > room:
                raise bad(
                    f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                    f"{longest_prompt} and max_tokens asks for {max_tokens}",
                    "max_tokens",
                    "context_length_exceeded",
                )
        return SamplingParams(
            n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, max_tokens=max_tokens, seed=req.seed
        )

    def _choice(self, req: GenerationRequest, ids: list[int], logprobs: list[float], reason: str) -> Choice:
        decode = self.tokenizer.decode
        text = decode(ids, skip_special_tokens=True)
        if req.stop:
            hits = [i for i in (text.find(s) for s in req.stop) if i >= 0]
            if hits:
                cut = min(hits)
                keep = len(ids)
                for t in range(1, len(ids) + 1):  # fewest tokens whose text reaches the stop sequence
                    if len(decode(ids[:t], skip_special_tokens=True)) > cut:
                        keep = t - 1 if len(decode(ids[: t - 1], skip_special_tokens=True)) >= cut else t
                        break
                ids, logprobs, text, reason = ids[:keep], logprobs[:keep], text[:cut], "stop"
        token_texts = [decode([t], skip_special_tokens=True) for t in ids] if req.logprobs else []
        return Choice(text, reason, list(ids), token_texts, list(logprobs))

    def close(self) -> None:
        self.batcher.close()
        self.engine.close()


def create_app(server: OpenAIServer):
    """A plain FastAPI app over ``server`` (for uvicorn, in-process tests); Ray Serve hosts the same handlers."""
    from fastapi import FastAPI, Request

    app = FastAPI(title="dapo serve")
    install_error_handlers(app)

    @app.get("/health")
    async def health(request: Request):
        return await server.health(request)

    @app.get("/v1/models")
    async def models(request: Request):
        return await server.models(request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await server.chat(request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.completions(request)

    return app


def install_error_handlers(app) -> None:
    """Unknown routes and wrong methods answer in the OpenAI error format too."""
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    async def http_error(request, exc: HTTPException):
        err = APIError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        return JSONResponse(err.body(), status_code=exc.status_code)

    app.add_exception_handler(HTTPException, http_error)
