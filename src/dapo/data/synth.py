"""Synthetic arithmetic word problems: the task `dapo train` runs on out of the box.

Every problem is a short story ("Mia has 7 apples. She buys 5 more. Then she gives away 3. How many apples does
she have now?") whose integer answer comes from chaining a few operations. Each problem carries a worked solution,
one equation per line, ending in the line ``Answer: N`` that the DAPO prompt template asks for; the embedded tiny
model (``dapo/assets/tiny-qwen2``) was supervised-fine-tuned on exactly these solutions, so its rollouts have that
shape and the rule-based reward can check the last ``Answer:`` line.

Generation is seeded (one ``random.Random(seed)`` per call, never the global RNG) and deterministic: the same
``(num, seed, config)`` always yields the same problems.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dapo.data.template import apply_dapo_template

SUPPORTED_OPERATIONS: tuple[str, ...] = ("+", "-", "*")
"""Operations a problem may chain. ``*`` multiplies by a small factor (2..max_factor)."""


@dataclass(frozen=True)
class SynthConfig:
    """Difficulty knobs of the synthetic task; the defaults are what the embedded tiny model was trained on.

    min_operands/max_operands: how many numbers a problem chains (2 numbers = 1 operation).
    max_value: largest starting amount and largest number added or subtracted (the smallest is ``min_value``).
    operations: which operations may appear, a subset of ``SUPPORTED_OPERATIONS``.
    word_problems: stories with names and objects (True) or bare expressions like ``Compute 7 + 5 - 3.`` (False).
    allow_negative: if False, a subtraction never takes more than the running total, so every intermediate value
        and the answer stay >= 0 (a story cannot give away apples it does not have).
    min_value: smallest number used as an operand.
    max_factor: largest multiplier used by ``*``.
    """

    min_operands: int = 2
    max_operands: int = 3
    max_value: int = 20
    operations: tuple[str, ...] = ("+", "-")
    word_problems: bool = True
    allow_negative: bool = False
    min_value: int = 1
    max_factor: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.min_operands, int) or self.min_operands < 2:
            raise ValueError(f"SynthConfig.min_operands must be an int >= 2, got {self.min_operands!r}")
        if not isinstance(self.max_operands, int) or self.max_operands < self.min_operands:
            raise ValueError(
                f"SynthConfig.max_operands must be an int >= min_operands ({self.min_operands}), "
                f"got {self.max_operands!r}"
            )
        if self.max_operands > 8:
            raise ValueError(f"SynthConfig.max_operands must be <= 8 (responses stay short), got {self.max_operands}")
        if not isinstance(self.min_value, int) or self.min_value < 0:
            raise ValueError(f"SynthConfig.min_value must be an int >= 0, got {self.min_value!r}")
        if not isinstance(self.max_value, int) or self.max_value < max(1, self.min_value):
            raise ValueError(
                f"SynthConfig.max_value must be an int >= max(1, min_value={self.min_value}), got {self.max_value!r}"
            )
        if not isinstance(self.operations, tuple) or not self.operations:
            raise ValueError(f"SynthConfig.operations must be a non-empty tuple, got {self.operations!r}")
        unknown = [op for op in self.operations if op not in SUPPORTED_OPERATIONS]
        if unknown:
            raise ValueError(
                f"SynthConfig.operations has unsupported entries {unknown!r}; supported: {SUPPORTED_OPERATIONS}"
            )
        if len(set(self.operations)) != len(self.operations):
            raise ValueError(f"SynthConfig.operations has duplicates: {self.operations!r}")
        if not isinstance(self.max_factor, int) or self.max_factor < 2:
            raise ValueError(f"SynthConfig.max_factor must be an int >= 2, got {self.max_factor!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (tuples become lists), e.g. for pretrain_report.json."""
        d = asdict(self)
        d["operations"] = list(self.operations)
        return d


@dataclass(frozen=True)
class SynthProblem:
    """One problem: its statement, integer answer and worked solution (last line ``Answer: N``)."""

    problem: str
    answer: int
    solution: str


def default_synth_config() -> SynthConfig:
    """The configuration the embedded tiny model was trained on (recorded in its pretrain_report.json)."""
    return SynthConfig()


# --- story vocabulary -------------------------------------------------------------------------------------------

_NAMES: tuple[tuple[str, str], ...] = (
    ("Mia", "she"),
    ("Liam", "he"),
    ("Emma", "she"),
    ("Noah", "he"),
    ("Olivia", "she"),
    ("Lucas", "he"),
    ("Ava", "she"),
    ("Ethan", "he"),
    ("Sofia", "she"),
    ("Leo", "he"),
    ("Zoe", "she"),
    ("Omar", "he"),
    ("Chloe", "she"),
    ("Ben", "he"),
    ("Nora", "she"),
    ("Sam", "he"),
    ("Lily", "she"),
    ("Max", "he"),
    ("Aisha", "she"),
    ("Ravi", "he"),
    ("Hana", "she"),
    ("Diego", "he"),
    ("Grace", "she"),
    ("Jack", "he"),
)
_OBJECTS: tuple[str, ...] = (
    "apples",
    "marbles",
    "stickers",
    "books",
    "coins",
    "pencils",
    "cookies",
    "cards",
    "shells",
    "stamps",
    "balloons",
    "candies",
    "toy cars",
    "flowers",
    "eggs",
    "beads",
    "crayons",
    "oranges",
    "bottles",
    "rocks",
)
_OBJECT_PRONOUN = {"she": "her", "he": "him"}

_OPENINGS: tuple[str, ...] = (
    "{Name} has {n} {obj}.",
    "{Name} starts with {n} {obj}.",
    "{Name} collected {n} {obj}.",
    "There are {n} {obj} in {Name}'s box.",
)
_ADD_PHRASES: tuple[str, ...] = (
    "{P} buys {n} more.",
    "{P} finds {n} more {obj}.",
    "A friend gives {O} {n} more {obj}.",
    "{P} gets {n} more.",
    "{P} wins {n} more {obj}.",
)
_SUB_PHRASES: tuple[str, ...] = (
    "{P} gives away {n}.",
    "{P} loses {n} {obj}.",
    "{P} sells {n} of them.",
    "{P} uses {n} {obj}.",
    "{P} gives {n} to a friend.",
)
_MUL_PHRASES: tuple[str, ...] = (
    "{P} ends up with {n} times as many.",
    "The number of {obj} grows {n} times.",
)
_QUESTIONS: tuple[str, ...] = (
    "How many {obj} does {p} have now?",
    "How many {obj} does {Name} have in the end?",
    "How many {obj} are there now?",
)


def _draw_operation(rng: random.Random, config: SynthConfig, current: int) -> tuple[str, int]:
    """Pick the next (operation, operand) given the running total, honouring allow_negative.

    Without negatives, a subtraction takes between min_value and the running total; if the total is below
    min_value, another operation is used when the config has one, else the subtraction takes the whole total.
    """
    op = rng.choice(config.operations)
    if op == "-" and not config.allow_negative and current < config.min_value:
        others = [o for o in config.operations if o != "-"]
        if not others:
            return "-", current
        op = rng.choice(others)
    if op == "*":
        return op, rng.randint(2, config.max_factor)
    if op == "-" and not config.allow_negative:
        return op, rng.randint(config.min_value, min(config.max_value, current))
    return op, rng.randint(config.min_value, config.max_value)


def _apply(op: str, a: int, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unsupported operation {op!r}")


def _story(rng: random.Random, start: int, steps: Sequence[tuple[str, int]]) -> str:
    name, pronoun = rng.choice(_NAMES)
    obj = rng.choice(_OBJECTS)
    fields = {"Name": name, "obj": obj, "P": pronoun.capitalize(), "p": pronoun, "O": _OBJECT_PRONOUN[pronoun]}
    sentences = [rng.choice(_OPENINGS).format(n=start, **fields)]
    for i, (op, n) in enumerate(steps):
        phrases = {"+": _ADD_PHRASES, "-": _SUB_PHRASES, "*": _MUL_PHRASES}[op]
        sentence = rng.choice(phrases).format(n=n, **fields)
        if i > 0 and rng.random() < 0.5:
            sentence = "Then " + sentence[0].lower() + sentence[1:]
        sentences.append(sentence)
    sentences.append(rng.choice(_QUESTIONS).format(**fields))
    return " ".join(sentences)


def _expression(start: int, steps: Sequence[tuple[str, int]]) -> str:
    text = str(start)
    for op, n in steps:
        text = f"({text}) {op} {n}" if op == "*" and len(text) > len(str(start)) else f"{text} {op} {n}"
    return f"Compute {text}."


def generate_synth_problems(num: int, seed: int, config: SynthConfig = SynthConfig()) -> list[SynthProblem]:
    """Generate `num` problems deterministically from `seed` (own ``random.Random``; global RNG untouched).

    The solution evaluates left to right, one line per operation (``7 + 5 = 12``), then ``Answer: N``.
    """
    if not isinstance(num, int) or num < 0:
        raise ValueError(f"generate_synth_problems: num must be an int >= 0, got {num!r}")
    if not isinstance(seed, int):
        raise ValueError(f"generate_synth_problems: seed must be an int, got {seed!r}")
    if not isinstance(config, SynthConfig):
        raise TypeError(f"generate_synth_problems: config must be a SynthConfig, got {type(config).__name__}")
    rng = random.Random(seed)
    problems: list[SynthProblem] = []
    for _ in range(num):
        num_operands = rng.randint(config.min_operands, config.max_operands)
        start = rng.randint(max(config.min_value, 1), config.max_value)
        current = start
        steps: list[tuple[str, int]] = []
        lines: list[str] = []
        for _ in range(num_operands - 1):
            op, n = _draw_operation(rng, config, current)
            result = _apply(op, current, n)
            lines.append(f"{current} {op} {n} = {result}")
            steps.append((op, n))
            current = result
        statement = _story(rng, start, steps) if config.word_problems else _expression(start, steps)
        lines.append(f"Answer: {current}")
        problems.append(SynthProblem(problem=statement, answer=current, solution="\n".join(lines)))
    return problems


def distinct_synth_problems(
    num: int, seed: int, config: SynthConfig = SynthConfig(), max_draws_per_problem: int = 50
) -> list[SynthProblem]:
    """The first ``num`` distinct problems (by statement) of the stream ``generate_synth_problems(·, seed)`` draws.

    A held-out set that repeats a problem measures it twice and the others less: small problem spaces (single-digit
    sums have 81) repeat within a few dozen draws. The stream is a prefix-stable sequence, so when it has no repeats
    this returns exactly ``generate_synth_problems(num, seed)``. Raises ``ValueError`` when the space holds fewer than
    ``num`` problems (none found in ``num * max_draws_per_problem`` draws).
    """
    seen: set[str] = set()
    problems: list[SynthProblem] = []
    for p in generate_synth_problems(num * max_draws_per_problem, seed, config):
        if p.problem not in seen:
            seen.add(p.problem)
            problems.append(p)
            if len(problems) == num:
                return problems
    raise ValueError(
        f"only {len(problems)} distinct problems exist with these knobs ({num} asked for); "
        "lower the number or widen the task (max_value, operands, operations)"
    )


def synth_records(
    problems: Sequence[SynthProblem], *, data_source: str = "synth_arith", split: str = "train"
) -> list[dict[str, Any]]:
    """DAPO-schema rows (the layout of DAPO-Math-17k) as plain dicts, prompt wrapped in the DAPO template."""
    records: list[dict[str, Any]] = []
    for i, p in enumerate(problems):
        if not isinstance(p, SynthProblem):
            raise TypeError(f"synth_records: item {i} is {type(p).__name__}, expected SynthProblem")
        records.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": apply_dapo_template(p.problem)}],
                "ability": "math",
                "reward_model": {"ground_truth": str(p.answer), "style": "rule"},
                "extra_info": {"index": i, "split": split, "raw_problem": p.problem, "solution": p.solution},
            }
        )
    return records
