"""The text of one streamed choice as its tokens arrive, one token at a time.

:class:`IncrementalDetokenizer` turns each new token into the text it adds, without splitting a character;
:class:`StreamedChoice` adds what a stream must hold back (text that could be the start of a stop string) and says
when a stop string has appeared. Both spell the text as ``tokenizer.decode`` spells the whole sequence, so the
concatenated deltas of a stream are the text of the same answer unstreamed.
"""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"  # what decode spells an incomplete UTF-8 sequence as


class IncrementalDetokenizer:
    """The text each token adds to a growing sequence, decoding only the tokens since the last text given out.

    Decoding the whole sequence per token would cost O(length) per token (quadratic in the answer). Instead each token
    decodes a window: the tokens whose text was given out last time (``_prefix:_read``) with and without the tokens
    since, and gives out the difference. A window that starts inside a character, or a tokenizer that drops a word's
    leading space at the start of a decode (SentencePiece), changes both decodes alike, so the difference is what the
    whole decode adds. A token that ends inside a character (byte-level BPE spells a CJK character or an emoji in 2-4
    byte tokens: each alone decodes to U+FFFD) gives out nothing until the character is complete, so no delta carries
    a broken character. Should the window's text ever not extend the previous one (a tokenizer whose decode of a
    window is not a prefix of the longer one's), the delta comes from the whole decode instead."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self.text = ""  # the text given out so far
        self._prefix = 0  # the window: ids[_prefix:_read] is the text given out last time
        self._read = 0

    def push(self, token: int) -> str:
        """The text ``token`` completes ("" while a character is still being spelled, or for a special token)."""
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        if after.startswith(before):
            delta = after[len(before) :]
        else:
            whole = self._decode(self.ids)
            if whole.endswith(REPLACEMENT) or not whole.startswith(self.text):
                return ""
            delta = whole[len(self.text) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta


class StreamedChoice:
    """One choice of a streamed answer: ``push`` each token, send what it returns; once ``stopped`` (a stop string
    appeared) or the engine ended the row, ``finish`` with the final choice (cut at the stop string) for the rest.

    Text is held back while it could be the start of a stop string (the last ``longest stop - 1`` characters), so a
    stream never sends text that the cut removes. Each token's log-prob is sent with the first text sent after it (a
    token whose text is held sends its log-prob with a later token's)."""

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]) -> None:
        self._detok = IncrementalDetokenizer(decode)
        self._stops = list(stops)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self.logprobs: list[float] = []
        self._sent = 0  # characters of the text sent
        self._sent_tokens = 0  # tokens whose log-probs were sent
        self.stopped = False

    @property
    def ids(self) -> list[int]:
        return self._detok.ids

    @property
    def text(self) -> str:
        return self._detok.text

    def push(self, token: int, logprob: float) -> tuple[str, list[int], list[float]] | None:
        """(text, token ids, log-probs) to send for this token, or None when it adds nothing that can be sent yet."""
        searched = len(self.text)
        self._detok.push(token)
        self.logprobs.append(logprob)
        if self._stops and any(self.text.find(s, max(0, searched - len(s) + 1)) >= 0 for s in self._stops):
            self.stopped = True  # the rest goes out with finish(), cut where the stop string starts
            return None
        safe = len(self.text) - self._hold
        if safe <= self._sent:
            return None
        return self._take(self.text[self._sent : safe], safe)

    def finish(self, text: str, ids: list[int], logprobs: list[float]) -> tuple[str, list[int], list[float]]:
        """What is left to send of the final choice: ``text`` (decoded from ``ids``, cut at a stop string) past what
        was sent, with the log-probs not sent yet."""
        return text[self._sent :], ids[self._sent_tokens :], logprobs[self._sent_tokens :]

    def _take(self, text: str, sent: int) -> tuple[str, list[int], list[float]]:
        ids, lps = self.ids[self._sent_tokens :], self.logprobs[self._sent_tokens :]
        self._sent, self._sent_tokens = sent, len(self.ids)
        return text, ids, lps
