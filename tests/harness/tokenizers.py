"""The tests' tokenizers: what the rollout, reward and evaluation code need of a tokenizer, with no vocabulary file."""

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


class WordTokenizer:
    """A tokenizer over a fixed list of pieces (greedy longest match), where ```` ``` ```` and ``python`` are single
    tokens as in BPE vocabularies (the tiny model's is character-level): what the rollout needs of a tokenizer."""

    eos = 0

    def __init__(self, pieces: Sequence[str]) -> None:
        self.pieces = ["<eos>", *pieces]

    def __len__(self) -> int:
        return len(self.pieces)

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            best = max((p for p in self.pieces[1:] if text.startswith(p, i)), key=len)
            ids.append(self.pieces.index(best))
            i += len(best)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[i] for i in ids if not (skip_special_tokens and i == self.eos))

    def batch_decode(self, rows: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(r, skip_special_tokens) for r in rows]
