"""A streamed choice's text, token by token, with the embedded model's byte-level BPE tokenizer (whose 256 byte tokens
spell any character: a CJK character or an emoji takes several tokens, each of which alone decodes to U+FFFD)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from dapo.model.loading import EMBEDDED_MODEL_DIR
from dapo.serve.stream_text import IncrementalDetokenizer, StreamedChoice

TOKENIZER = AutoTokenizer.from_pretrained(EMBEDDED_MODEL_DIR)
DECODE = functools.partial(TOKENIZER.decode, skip_special_tokens=True)
MIXED = "Tom hat 3 Äpfel, 日本語 and 😀 = 7; naïve café."


def _deltas(ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(DECODE)
    return [detok.push(t) for t in ids]


def test_characters_split_across_tokens_come_out_whole_and_once():
    ids = TOKENIZER.encode(MIXED, add_special_tokens=False)
    assert len(ids) > len(MIXED.split()) and any(DECODE([t]) == "\ufffd" for t in ids)  # some tokens split characters
    deltas = _deltas(ids)
    assert "".join(deltas) == MIXED
    assert not any("\ufffd" in d for d in deltas)  # a per-token decode would send broken characters
    # every token that completes text gives it out at once: no delta is held back longer than its character needs
    whole = [DECODE(ids[: k + 1]) for k in range(len(ids))]
    for k, delta in enumerate(deltas):
        if not whole[k].endswith("\ufffd"):
            assert "".join(deltas[: k + 1]) == whole[k]


def test_an_ascii_answer_gives_one_delta_per_token():
    ids = TOKENIZER.encode("23 - 13 = 10\nAnswer: 10", add_special_tokens=False)
    deltas = _deltas(ids)
    assert all(deltas) and len(deltas) == len(ids)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(TOKENIZER) - 1), max_size=40))
def test_the_deltas_of_any_token_sequence_add_up_to_its_decode(ids):
    # any ids: special tokens (no text), lone continuation bytes, sequences cut inside a character
    deltas = _deltas(ids)
    whole = DECODE(ids)
    assert whole.startswith("".join(deltas))
    held = whole[len("".join(deltas)) :]  # only what a character still being spelled may hold back
    assert held == "" or whole.endswith("\ufffd")


def test_text_that_could_start_a_stop_string_is_held_and_the_stop_ends_the_choice():
    text = "12 + 3 = 15\nAnswer: 15"
    ids = TOKENIZER.encode(text, add_special_tokens=False)
    choice = StreamedChoice(DECODE, ["\nAns"])
    sent = []
    for t in ids:
        out = choice.push(t, -0.5)
        if out is not None:
            sent.append(out[0])
            assert "\n" not in "".join(sent)  # the stop string's first characters were never sent
        if choice.stopped:
            break
    assert choice.stopped and len(choice.ids) < len(ids)
    rest, _, _ = choice.finish(text[: text.index("\nAns")], choice.ids, choice.logprobs)
    assert "".join(sent) + rest == "12 + 3 = 15"


def test_each_tokens_logprob_is_sent_once_with_the_text_it_completes():
    ids = TOKENIZER.encode("日本 ok", add_special_tokens=False)
    choice = StreamedChoice(DECODE, [])
    sent_ids, sent_lps = [], []
    for k, t in enumerate(ids):
        out = choice.push(t, -float(k))
        if out is not None:
            sent_ids += out[1]
            sent_lps += out[2]
    _, rest_ids, rest_lps = choice.finish(DECODE(ids), ids, choice.logprobs)
    assert sent_ids + rest_ids == ids and sent_lps + rest_lps == [-float(k) for k in range(len(ids))]


@pytest.mark.parametrize("stops", [[], ["xyz"]])
def test_finish_sends_exactly_what_was_held(stops):
    ids = TOKENIZER.encode("abc 日", add_special_tokens=False)[:-1]  # ends inside the character
    choice = StreamedChoice(DECODE, stops)
    sent = "".join(out[0] for t in ids if (out := choice.push(t, 0.0)) is not None)
    rest, _, _ = choice.finish(DECODE(ids), ids, choice.logprobs)
    assert sent + rest == DECODE(ids)
