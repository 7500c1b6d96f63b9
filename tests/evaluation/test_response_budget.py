"""dapo eval's response budget against the model's context, by hand: 512 positions, a 92-token prompt leave 420."""

from __future__ import annotations

import pytest

from dapo.evaluation.backends import EvalError
from dapo.evaluation.response_budget import DEFAULT_MAX_TOKENS, response_budget


def test_default_is_1024_or_what_the_longest_prompt_leaves():
    assert DEFAULT_MAX_TOKENS == 1024
    assert response_budget(None, 512, 92, model="m") == 420  # the tiny model: 512 - 92
    assert response_budget(None, 4096, 100, model="m") == 1024
    assert response_budget(None, None, 92, model="m") == 1024  # context unknown: no cap


def test_a_budget_that_fits_is_kept():
    assert response_budget(420, 512, 92, model="m") == 420
    assert response_budget(20480, None, 92, model="m") == 20480


def test_a_budget_past_the_context_is_refused_naming_it_and_the_room():
    with pytest.raises(
        EvalError,
        match=r"--max-tokens 20480 .*92 tokens.*512-token context of m; pass "
        r"--max-tokens 420 or less",
    ):
        response_budget(20480, 512, 92, model="m")
    with pytest.raises(EvalError, match="421"):
        response_budget(421, 512, 92, model="m")
    with pytest.raises(EvalError, match="longest prompt has 512 tokens"):
        response_budget(None, 512, 512, model="m")


def test_a_server_keeps_half_its_context_for_prompts_by_default():
    """Behind --base-url the prompts are tokenized by the server: half of max_model_len is left to them."""
    assert response_budget(None, 512, None, model="s") == 256
    assert response_budget(None, 32768, None, model="s") == 1024
    assert response_budget(500, 512, None, model="s") == 500  # the server judges prompt + 500 itself
    with pytest.raises(EvalError, match="--max-tokens 512 leaves no room for a prompt in the 512-token context of s"):
        response_budget(512, 512, None, model="s")
