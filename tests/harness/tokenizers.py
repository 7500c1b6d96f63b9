"""The tests' character tokenizer: what the rollout, reward and evaluation code need of a tokenizer, with no
vocabulary file."""

from __future__ import annotations

from collections.abc import Sequence

CHAT_VOCAB = 5000  # a chat prompt's ids are its characters' code points modulo this


class CharTokenizer:
    """A character is a token, its id its code point: a response's text and its token count are one thing to read.
    A chat prompt is its last message's characters (ids modulo ``CHAT_VOCAB``); there are no special tokens."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def batch_decode(self, rows: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(row) for row in rows]

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = True) -> list[int]:
        return [ord(c) % CHAT_VOCAB for c in messages[-1]["content"]]
