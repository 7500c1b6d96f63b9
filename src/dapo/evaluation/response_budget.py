"""How many tokens ``dapo eval`` asks for per sample: ``--max-tokens``, held to the model's context.

A prompt and its response share the model's context (``max_position_embeddings``; a server's ``max_model_len``). A
budget past it is refused here with the numbers, before any sample: a server answers each request 400 (the run dies
after its first), and a local engine would silently decode past the position table the model was trained on. With
no ``--max-tokens`` the budget is 1024 or what the context leaves, whichever is less, so the default fits any model
(the embedded tiny one has 512 positions)."""

from __future__ import annotations

from dapo.evaluation.backends import EvalError

DEFAULT_MAX_TOKENS = 1024  # the response cap when --max-tokens is not given (the paper evaluates with 20480)


def response_budget(requested: int | None, context: int | None, longest_prompt: int | None, *, model: str) -> int:
    """The response budget: ``requested`` (``--max-tokens``, None = the default) checked against ``context`` (None =
    unknown: no check) after ``longest_prompt`` tokens (None = the prompts are tokenized elsewhere, by a server: half
    the context is left to them by default, and only a budget that leaves none is refused here)."""
    if context is None:
        return requested or DEFAULT_MAX_TOKENS
    where = f"the {context}-token context of {model}"
    if longest_prompt is None:
        if requested is None:
            return min(DEFAULT_MAX_TOKENS, max(1, context // 2))
        if requested >= context:
            raise EvalError(
                f"--max-tokens {requested} leaves no room for a prompt in {where}; pass --max-tokens "
                f"below {context} (or leave it out: the default fits the context)"
            )
        return requested
    room = context - longest_prompt
    if room < 1:
        raise EvalError(
            f"the longest prompt has {longest_prompt} tokens, which fills {where}: no room for a "
            "response (--max-prompt-length refuses long prompts up front)"
        )
    if requested is None:
        return min(DEFAULT_MAX_TOKENS, room)
    if requested > room:
        raise EvalError(
            f"--max-tokens {requested} after the longest prompt ({longest_prompt} tokens) exceeds {where}; "
            f"pass --max-tokens {room} or less, or leave it out (the "
            "default fits the context)"
        )
    return requested
