"""A teacher behind an OpenAI-compatible server: the log-probs of given token ids, from ``prompt_logprobs``.

One ``POST {url}/completions`` per chunk of responses, each prompt the student's prompt + response token ids, with
``max_tokens=1``, ``temperature=1`` and ``prompt_logprobs=0``: the server runs a forward pass over the ids and returns,
per position after the first, a mapping ``{token id: {"logprob": ...}}`` that holds the token at that position (vLLM's
``prompt_logprobs``; ``dapo serve`` answers the same, ``dapo.serve.server``). The response positions are the
teacher's scores of exactly the student's tokens. The one generated token is discarded.

Before the first step the server tokenizes a probe text, and the ids it reports must be the student's (the
vocabulary check a served teacher allows, ``dapo.distillation.vocabulary``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import torch
from torch import Tensor

from dapo.actor.batch import TrainBatch
from dapo.distillation.teacher import TeacherError
from dapo.distillation.vocabulary import PROBE_TEXT, check_same_ids

__all__ = ["ServedTeacher", "api_base"]

MAX_SEQUENCES_PER_REQUEST = 16  # dapo serve's default max_sequences_per_request is larger; small bodies stream better


def api_base(url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1`` -> ``http://host:port/v1``."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class ServedTeacher:
    """Teacher ``name`` served at ``url``; ``served_model_name`` None asks the server for its first model."""

    def __init__(
        self, name: str, url: str, *, served_model_name: str | None, timeout_s: float, student_tokenizer: object
    ) -> None:
        self.name = name
        self.base = api_base(url)
        self.timeout_s = timeout_s
        if served_model_name is None:
            models = self._call("GET", "/models", None).get("data") or []
            if not models or not isinstance(models[0], dict) or "id" not in models[0]:
                raise TeacherError(f"distillation teacher '{name}' at {self.base}: /models lists no model")
            served_model_name = str(models[0]["id"])
            self.root = str(models[0].get("root", served_model_name))
        else:
            self.root = served_model_name
        self.model = served_model_name
        student_ids = student_tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        answer = self._completions(PROBE_TEXT)
        positions = self._prompt_logprobs(answer, 0, None)  # its own tokenization: any length
        # prompt_logprobs=0: each position maps exactly its own token (the first position has none)
        served_ids = [int(next(iter(entry))) for entry in positions[1:]]
        check_same_ids(name, served_ids, student_ids[1:])

    # ------------------------------------------------------------------------------------------------ HTTP
    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            raise TeacherError(
                f"distillation teacher '{self.name}' at {self.base}{path}: HTTP {exc.code}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TeacherError(
                f"distillation teacher '{self.name}' at {self.base}{path}: cannot reach it "
                f"({reason}); is the server running?"
            ) from None
        try:
            out = json.loads(payload)
        except json.JSONDecodeError:
            raise TeacherError(
                f"distillation teacher '{self.name}' at {self.base}{path}: the answer is not JSON"
            ) from None
        if not isinstance(out, dict):
            raise TeacherError(
                f"distillation teacher '{self.name}' at {self.base}{path}: the answer is not a JSON object"
            )
        return out

    def _completions(self, prompt: Any) -> dict[str, Any]:
        return self._call(
            "POST",
            "/completions",
            {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0},
        )

    def _prompt_logprobs(self, answer: dict[str, Any], index: int, length: int | None) -> list[dict[str, Any]]:
        """The ``prompt_logprobs`` of choice ``index`` of ``answer``, checked to cover ``length`` positions."""
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices:
            raise TeacherError(f"distillation teacher '{self.name}' at {self.base}: the answer has no choices")
        by_index = {c.get("index", i): c for i, c in enumerate(choices) if isinstance(c, dict)}
        choice = by_index.get(index)
        plp = None if choice is None else choice.get("prompt_logprobs")
        if not isinstance(plp, list) or not plp:
            raise TeacherError(
                f"distillation teacher '{self.name}' at {self.base} returned no prompt_logprobs for "
                f"sequence {index}: the server must support prompt_logprobs (vllm serve, dapo serve)"
            )
        if length is not None and len(plp) != length:
            raise TeacherError(
                f"distillation teacher '{self.name}' at {self.base} returned {len(plp)} prompt "
                f"log-probs for sequence {index} of {length} tokens"
            )
        if not all(isinstance(e, dict) and e for e in plp[1:]):
            raise TeacherError(
                f"distillation teacher '{self.name}' at {self.base}: a prompt_logprobs entry of "
                f"sequence {index} is empty"
            )
        return plp

    # ------------------------------------------------------------------------------------------------ Teacher
    def log_probs(self, batch: TrainBatch) -> list[Tensor]:
        out: list[Tensor] = []
        sequences = [p.tolist() + r.tolist() for p, r in zip(batch.prompt_ids, batch.response_ids, strict=True)]
        for start in range(0, len(sequences), MAX_SEQUENCES_PER_REQUEST):
            chunk = sequences[start : start + MAX_SEQUENCES_PER_REQUEST]
            answer = self._completions(chunk)
            for j, ids in enumerate(chunk):
                i = start + j
                positions = self._prompt_logprobs(answer, j, len(ids))
                prompt_len = int(batch.prompt_ids[i].numel())
                values = []
                for pos in range(prompt_len, len(ids)):
                    entry = positions[pos].get(str(ids[pos]))
                    if not isinstance(entry, dict) or "logprob" not in entry:
                        raise TeacherError(
                            f"distillation teacher '{self.name}' at {self.base}: position {pos} of "
                            f"sequence {i} has no log-prob for its token {ids[pos]}"
                        )
                    values.append(float(entry["logprob"]))
                out.append(torch.tensor(values, dtype=torch.float32))
        return out

    def top_log_probs(self, batch: TrainBatch, k: int) -> tuple[list[Tensor], list[Tensor]]:
        raise TeacherError(
            f"distillation teacher '{self.name}': top-k log-probs of a served teacher are not built; "
            "use a local teacher folder for forward_kl_topk"
        )

    def identity(self) -> str:
        return f"served {self.base} model={self.model} root={self.root}"

    def close(self) -> None:
        pass
