"""The synthetic word-problem task: seeded, varied, self-consistent, DAPO-schema records."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.data.schema import DapoRecord
from dapo.data.synth import (
    SUPPORTED_OPERATIONS,
    SynthConfig,
    SynthProblem,
    default_synth_config,
    distinct_synth_problems,
    generate_synth_problems,
    synth_records,
)
from dapo.data.template import apply_dapo_template

_STEP = re.compile(r"^(-?\d+) ([+\-*]) (-?\d+) = (-?\d+)$")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def replay_solution(p: SynthProblem) -> tuple[list[tuple[int, str, int]], int]:
    """Evaluate the worked steps independently; return the (a, op, b) steps and the value they reach.

    Fails if a step's arithmetic is wrong, a step does not continue from the previous result, or the last line is
    not "Answer: <the reached value>".
    """
    *steps, last = p.solution.split("\n")
    assert steps, f"no worked steps in {p.solution!r}"
    parsed: list[tuple[int, str, int]] = []
    value: int | None = None
    for line in steps:
        m = _STEP.match(line)
        assert m, f"step line {line!r} is not 'a op b = c'"
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        assert value is None or a == value, f"step {line!r} does not continue from {value}"
        assert _OPS[op](a, b) == c, f"wrong arithmetic in {line!r}"
        parsed.append((a, op, b))
        value = c
    assert last == f"Answer: {value}", f"last line {last!r} should be 'Answer: {value}'"
    return parsed, value


configs = st.builds(
    SynthConfig,
    min_operands=st.integers(2, 3),
    max_operands=st.integers(3, 5),
    max_value=st.integers(1, 60),
    operations=st.sampled_from([("+",), ("-",), ("+", "-"), ("+", "-", "*"), ("*",), ("-", "*")]),
    word_problems=st.booleans(),
    allow_negative=st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), config=configs)
def test_every_answer_is_what_its_own_solution_computes(seed: int, config: SynthConfig) -> None:
    for p in generate_synth_problems(8, seed, config):
        steps, value = replay_solution(p)
        assert p.answer == value
        assert config.min_operands - 1 <= len(steps) <= config.max_operands - 1
        assert all(op in config.operations for _, op, _ in steps)
        # The statement mentions exactly the numbers the solution uses, in order (names/objects carry no digits).
        assert [int(x) for x in re.findall(r"\d+", p.problem)] == [steps[0][0]] + [b for _, _, b in steps]
        if not config.allow_negative:
            assert all(a >= 0 for a, _, _ in steps) and value >= 0
        for _, op, b in steps:
            if op == "*":
                assert 2 <= b <= config.max_factor
            else:
                assert b <= config.max_value


def test_hand_checked_example() -> None:
    p = SynthProblem(problem="x", answer=9, solution="7 + 5 = 12\n12 - 3 = 9\nAnswer: 9")
    assert replay_solution(p) == ([(7, "+", 5), (12, "-", 3)], 9)
    with pytest.raises(AssertionError, match="wrong arithmetic"):
        replay_solution(SynthProblem(problem="x", answer=9, solution="7 + 5 = 13\nAnswer: 13"))


def test_same_seed_same_problems_other_seed_other_problems() -> None:
    a = generate_synth_problems(50, seed=7)
    assert a == generate_synth_problems(50, seed=7)
    assert generate_synth_problems(20, seed=7) == a[:20]  # a prefix of the same stream
    b = generate_synth_problems(50, seed=8)
    assert sum(x.problem == y.problem for x, y in zip(a, b)) < 5


def test_global_rng_is_untouched() -> None:
    random.seed(123)
    state = random.getstate()
    generate_synth_problems(20, seed=1)
    assert random.getstate() == state


def test_problems_are_varied() -> None:
    problems = generate_synth_problems(300, seed=0)
    assert len({p.problem for p in problems}) >= 295
    first_words = {p.problem.split()[0] for p in problems}  # names, plus "There" of the box opening
    assert len(first_words) >= 15
    objects = {re.search(r"How many (.+?) (?:does|are)", p.problem)[1] for p in problems}
    assert len(objects) >= 15
    assert len({p.answer for p in problems}) >= 30
    operand_counts = {p.solution.count("=") + 1 for p in problems}
    assert operand_counts == {2, 3}
    assert any(" - " in p.solution for p in problems) and any(" + " in p.solution for p in problems)


def test_difficulty_knobs_change_the_mix() -> None:
    easy = generate_synth_problems(200, seed=3, config=SynthConfig(max_operands=2, max_value=5, operations=("+",)))
    assert all(p.solution.count("\n") == 1 and " + " in p.solution for p in easy)
    assert max(p.answer for p in easy) <= 10
    hard = generate_synth_problems(
        200, seed=3, config=SynthConfig(min_operands=4, max_operands=4, max_value=50, operations=("+", "-", "*"))
    )
    assert all(p.solution.count("=") == 3 for p in hard)
    assert any(" * " in p.solution for p in hard)
    assert max(p.answer for p in hard) > 100
    bare = generate_synth_problems(5, seed=3, config=SynthConfig(word_problems=False))
    assert all(p.problem.startswith("Compute ") for p in bare)


def test_allow_negative_produces_negative_answers() -> None:
    config = SynthConfig(operations=("-",), max_operands=4, allow_negative=True)
    assert any(p.answer < 0 for p in generate_synth_problems(100, seed=0, config=config))


def test_defaults_are_the_trained_configuration() -> None:
    assert default_synth_config() == SynthConfig()
    assert SynthConfig().to_dict() == {
        "min_operands": 2,
        "max_operands": 3,
        "max_value": 20,
        "operations": ["+", "-"],
        "word_problems": True,
        "allow_negative": False,
        "min_value": 1,
        "max_factor": 5,
    }


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_operands": 1}, "min_operands"),
        ({"min_operands": 3, "max_operands": 2}, "max_operands"),
        ({"max_operands": 9}, "max_operands"),
        ({"max_value": 0}, "max_value"),
        ({"min_value": -1}, "min_value"),
        ({"min_value": 5, "max_value": 4}, "max_value"),
        ({"operations": ()}, "operations"),
        ({"operations": ["+"]}, "operations"),
        ({"operations": ("+", "/")}, "operations"),
        ({"operations": ("+", "+")}, "operations"),
        ({"max_factor": 1}, "max_factor"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"SynthConfig.{field}"):
        SynthConfig(**kwargs)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="num"):
        generate_synth_problems(-1, seed=0)
    with pytest.raises(TypeError, match="config"):
        generate_synth_problems(1, seed=0, config={"max_value": 3})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="item 1"):
        synth_records([generate_synth_problems(1, 0)[0], "not a problem"])  # type: ignore[list-item]


def test_supported_operations() -> None:
    assert SUPPORTED_OPERATIONS == ("+", "-", "*")


def test_records_follow_the_dapo_schema() -> None:
    problems = generate_synth_problems(10, seed=5)
    rows = synth_records(problems, split="test", data_source="synth_x")
    for i, (row, p) in enumerate(zip(rows, problems)):
        assert row == {
            "data_source": "synth_x",
            "prompt": [{"role": "user", "content": apply_dapo_template(p.problem)}],
            "ability": "math",
            "reward_model": {"ground_truth": str(p.answer), "style": "rule"},
            "extra_info": {"index": i, "split": "test", "raw_problem": p.problem, "solution": p.solution},
        }
        record = DapoRecord.from_row(row, source="<synth>", row_index=i)  # the project's own validator
        assert record.ground_truth == str(p.answer)
    assert synth_records(problems)[0]["data_source"] == "synth_arith"
    assert synth_records(problems)[0]["extra_info"]["split"] == "train"


SINGLE_DIGIT_SUMS = SynthConfig(min_operands=2, max_operands=2, max_value=9, operations=("+",), word_problems=False)


def test_distinct_problems_are_the_streams_first_distinct_ones() -> None:
    stream = generate_synth_problems(400, seed=3, config=SINGLE_DIGIT_SUMS)
    distinct = distinct_synth_problems(64, seed=3, config=SINGLE_DIGIT_SUMS)
    assert len({p.problem for p in stream[:64]}) < 64  # 81 problems: 64 draws repeat some (why this exists)
    assert len({p.problem for p in distinct}) == 64
    firsts = list({p.problem: p for p in reversed(stream)}.values())[::-1]  # first occurrences, in stream order
    assert distinct == sorted(firsts, key=stream.index)[:64]


def test_distinct_problems_equal_the_stream_when_it_does_not_repeat() -> None:
    assert distinct_synth_problems(50, seed=7) == generate_synth_problems(50, seed=7)  # stories rarely repeat


def test_asking_for_more_distinct_problems_than_exist_says_how_many_do() -> None:
    with pytest.raises(ValueError, match=r"only 81 distinct problems exist with these knobs \(82 asked for\)"):
        distinct_synth_problems(82, seed=0, config=SINGLE_DIGIT_SUMS)
