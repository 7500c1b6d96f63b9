"""Hypothesis fuzzing with bounded time: the reward scorers, the reward return validator, the data validator and the
config parser raise nothing but their documented errors, and anything the config accepts, the core functions accept.

Time is bounded twice: a per-example ``deadline`` (generous, for a loaded 2-core CI machine, but far below what a
catastrophic regular expression or a parser loop would take) and a whole-test ``timeout``. ``max_examples`` keeps each
test to a few seconds here.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dapo.config import ConfigError, build_config, load_config
from dapo.core.overlong import compute_soft_overlong_penalty
from dapo.core.policy_loss import compute_policy_loss
from dapo.data.loaders import load_records
from dapo.data.schema import DapoRecord, DataError
from dapo.reward import math_dapo, math_dapo_reference
from dapo.reward.batch import RewardScorer
from dapo.reward.records import FLOAT32_MAX, InvalidRewardError, RewardInput, RewardResult, as_reward_result
from dapo.reward.registry import UnknownDataSourceError, builtin_registry

DEADLINE = timedelta(seconds=3)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.integers(min_value=-(10**400), max_value=10**400),
)
returns = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["score", "acc", "pred", "extra"]), inner, max_size=4),
    ),
    max_leaves=8,
)


@pytest.mark.timeout(120)
@settings(max_examples=1500, deadline=None)
@given(returns)
def test_reward_return_validation_accepts_only_valid_rewards(raw: object) -> None:
    try:
        result = as_reward_result(raw, where="fuzzed scorer")
    except InvalidRewardError as exc:
        assert "fuzzed scorer" in str(exc)
        return
    assert isinstance(result, RewardResult) and type(result.acc) is bool and isinstance(result.pred, str)
    assert math.isfinite(result.score) and abs(result.score) <= FLOAT32_MAX
    if isinstance(raw, dict) and "acc" in raw:
        assert isinstance(raw["acc"], bool) or raw["acc"] in (0, 1)


KEYS = [
    "actor.clip_ratio_low",
    "actor.clip_ratio_high",
    "actor.clip_ratio_c",
    "actor.optim.lr",
    "actor.optim.betas",
    "reward_model.timeout_s",
    "reward_model.max_failures",
    "reward_model.on_failure",
    "data.max_response_length",
    "reward_model.overlong_buffer.len",
    "reward_model.overlong_buffer.penalty_factor",
    "rollout.n",
    "data.train_batch_size",
    "trainer.resume_mode",
    "no.such.key",
    "actor.grad_clip",
]
values = st.one_of(
    st.floats(),
    st.integers(min_value=-5, max_value=300),
    st.sampled_from(
        ["null", "true", "[0.9, 0.999]", "[1.5, 0.9]", ".inf", ".nan", "stop", "score_as_failed", "{a: 1}", "[", "'x"]
    ),
    st.text(max_size=10),
)


@pytest.mark.timeout(180)
@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS), values), max_size=5))
def test_config_parser_raises_only_config_errors_and_what_it_accepts_the_run_accepts(pairs) -> None:
    overrides = [f"{k}={v}" for k, v in pairs]
    try:
        cfg = build_config({}, overrides)
    except ConfigError:
        return
    a = cfg.actor
    t = torch.zeros(1, 3)
    compute_policy_loss(
        t,
        t,
        torch.ones(1, 3),
        torch.ones(1, 3, dtype=torch.bool),
        clip_ratio_low=a.clip_ratio_low,
        clip_ratio_high=a.clip_ratio_high,
        clip_ratio_c=a.clip_ratio_c,
    )
    ob = cfg.reward_model.overlong_buffer
    if ob.enable:
        compute_soft_overlong_penalty(
            torch.tensor([0, cfg.data.max_response_length]),
            max_response_length=cfg.data.max_response_length,
            overlong_buffer_len=ob.len,
            penalty_factor=ob.penalty_factor,
        )
    torch.optim.AdamW(
        [torch.nn.Parameter(torch.zeros(1))],
        lr=a.optim.lr,
        betas=a.optim.betas,
        eps=a.optim.eps,
        weight_decay=a.optim.weight_decay,
    )


# ------------------------------------------------------------------------------------------------ reward scorers
# Responses built from the pieces the scorers look for, so that the interesting branches are reached, plus free text.
PIECES = [
    "Answer:",
    "answer :",
    "\\boxed{",
    "{",
    "}",
    "\\frac{1}{2}",
    "$",
    "\\text{",
    "\\dfrac",
    "\\left(",
    "\\right)",
    "1,000",
    "-",
    "\u2212",
    " ",
    "\n",
    "0",
    "7",
    "42",
    "3.5",
    "x",
    "an ",
    "\\sqrt",
    "^",
    "%",
    "\\!",
    "\\%",
    "degrees",
    "units",
    "=",
    "\\",
    "\x00",
    "\U0001f600",
]
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=40).map("".join)
long_texts = st.tuples(texts, st.integers(0, 3000)).map(lambda t: "x" * t[1] + t[0])  # past the 300-char tail
pause_index = st.one_of(st.none(), st.lists(st.integers(-400, 400), min_size=4, max_size=4))


def _check_score(result: dict) -> None:
    assert set(result) == {"score", "acc", "pred"}
    # pred is None where the upstream scorer's is (strict mode without a \boxed{} answer: docs/reward.md)
    assert result["score"] in (1.0, -1.0) and type(result["acc"]) is bool
    assert result["pred"] is None or isinstance(result["pred"], str)
    assert (result["score"] == 1.0) == result["acc"]


@pytest.mark.timeout(120)
@settings(max_examples=400, deadline=DEADLINE)
@given(st.one_of(texts, long_texts), texts, st.booleans(), pause_index)
def test_math_dapo_scorers_never_raise_on_text(solution: str, truth: str, strict: bool, pause) -> None:
    try:
        _check_score(math_dapo.compute_score(solution, truth, strict_box_verify=strict, pause_tokens_index=pause))
    except ValueError as exc:  # documented: pause positions are 4 non-negative ints (checked in strict mode only)
        assert strict and pause is not None and min(pause) < 0 and "pause_tokens_index" in str(exc)
    _check_score(math_dapo_reference.compute_score(solution, truth, strict_box_verify=strict, pause_tokens_index=pause))
    # the same answer on both sides is always correct for the improved scorer when it can read one
    boxed = math_dapo.compute_score(f"Answer: {truth}", truth)
    assert boxed["acc"] or not boxed["pred"] or "\n" in truth or len(truth) > 290


REGISTRY = builtin_registry()


@pytest.mark.timeout(120)
@settings(max_examples=150, deadline=DEADLINE)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "math_dapo",
                    "DAPO-Math-17k",
                    "aime24",
                    "AIME_2025",
                    "synth_arith",
                    "gsm8k",
                    "openai/gsm8k",
                    "no_such_source",
                ]
            ),
            texts,
            texts,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_reward_scorer_in_process_returns_valid_rewards_or_names_the_unknown_source(items) -> None:
    batch = [RewardInput(source, solution, truth) for source, solution, truth in items]
    with RewardScorer(num_workers=0, registry=REGISTRY) as scorer:
        try:
            results = scorer.score(batch)
        except UnknownDataSourceError as exc:
            assert "no_such_source" in str(exc) and any(i.data_source == "no_such_source" for i in batch)
            return
        assert scorer.counts == {"timeout": 0, "worker_crash": 0, "error": 0}  # built-ins never fail on text
    assert len(results) == len(batch) and all(isinstance(r, RewardResult) and not r.failure for r in results)
    assert all(r.score in (1.0, -1.0) and type(r.acc) is bool for r in results)


# ------------------------------------------------------------------------------------------------ data validator
def _valid_parquet_bytes() -> bytes:
    row = {
        "data_source": "d",
        "prompt": [{"role": "user", "content": "1+1?"}],
        "ability": "math",
        "reward_model": {"ground_truth": "2", "style": "rule"},
        "extra_info": {"index": 0},
    }
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([row, row]), sink)
    return sink.getvalue()


VALID_PARQUET = _valid_parquet_bytes()
VALID_LINE = json.dumps(
    {"data_source": "d", "prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}
).encode()
# Byte strings near valid files: random bytes, valid files with bytes overwritten, JSON lines with junk spliced in.
mutations = st.lists(st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=4)), max_size=4)


def _mutate(data: bytes, edits) -> bytes:
    out = bytearray(data)
    for at, patch in edits:
        at %= max(1, len(out))
        out[at : at + len(patch)] = patch
    return bytes(out)


file_bytes = st.one_of(
    st.binary(max_size=200),
    st.tuples(st.just(VALID_PARQUET), mutations).map(lambda t: _mutate(*t)),
    st.lists(
        st.one_of(
            st.just(VALID_LINE),
            st.binary(max_size=30),
            st.tuples(st.just(VALID_LINE), mutations).map(lambda t: _mutate(*t)),
        ),
        max_size=5,
    ).map(b"\n".join),
)


def _check_records(records: list[DapoRecord]) -> None:
    for r in records:
        assert isinstance(r.data_source, str) and r.data_source.strip() and r.prompt
        assert isinstance(r.ground_truth, str) and r.ground_truth and isinstance(r.extra_info, dict)
        assert all(m.role in ("system", "user", "assistant") and m.content.strip() for m in r.prompt)


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=DEADLINE, suppress_health_check=[HealthCheck.too_slow])
@given(file_bytes, st.sampled_from([".jsonl", ".json", ".parquet"]))
def test_data_validator_on_random_bytes_raises_only_data_errors(data: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"fuzz{suffix}"
        path.write_bytes(data)
        try:
            records = load_records(path)
        except DataError as exc:
            assert str(path) in str(exc) or "fuzz" in str(exc)
            return
    _check_records(records)


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False), st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["role", "content", "ground_truth", "style", "index", "x"]), inner, max_size=3),
    ),
    max_leaves=10,
)
rows = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "data_source": json_values,
            "prompt": json_values,
            "ability": json_values,
            "reward_model": json_values,
            "extra_info": json_values,
            "__index_level_0__": json_scalars,
        },
    ),
)


@pytest.mark.timeout(120)
@settings(max_examples=300, deadline=DEADLINE)
@given(st.lists(rows, min_size=1, max_size=4), st.sampled_from([".jsonl", ".parquet"]))
def test_data_validator_on_random_rows_accepts_only_schema_rows(row_list, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"rows{suffix}"
        if suffix == ".jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in row_list))
        else:
            try:  # a table needs one type per column: rows pyarrow cannot type are no parquet file to test
                pq.write_table(pa.Table.from_pylist([r for r in row_list if isinstance(r, dict)]), path)
            except (pa.ArrowException, ValueError, TypeError, OverflowError):
                assume(False)
        try:
            records = load_records(path)
        except DataError as exc:
            assert "rows" in str(exc)
            return
    _check_records(records)


# -------------------------------------------------------------------------------------------------- config parser
override_keys = st.one_of(
    st.sampled_from(KEYS),
    st.sampled_from(["actor", "actor.optim", "trainer.", ".x", "a..b", "model.path", "data.train_files"]),
    st.text(max_size=12),
)
override_values = st.one_of(values, st.text(max_size=20))


@pytest.mark.timeout(120)
@settings(max_examples=400, deadline=DEADLINE)
@given(
    st.lists(
        st.one_of(st.tuples(override_keys, override_values).map(lambda kv: f"{kv[0]}={kv[1]}"), st.text(max_size=20)),
        max_size=4,
    )
)
def test_random_override_strings_raise_only_config_errors(overrides: list[str]) -> None:
    try:
        cfg = build_config({}, overrides)
    except ConfigError as exc:
        assert str(exc)
        return
    assert cfg.trainer.total_training_steps is None or cfg.trainer.total_training_steps >= 0


yaml_texts = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.tuples(override_keys, override_values).map(lambda kv: f"{kv[0].replace('.', ':  ')}: {kv[1]}"), max_size=4
    ).map("\n".join),
)


@pytest.mark.timeout(120)
@settings(max_examples=200, deadline=DEADLINE)
@given(yaml_texts)
def test_random_config_files_raise_only_config_errors(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_config(path)
        except ConfigError as exc:
            assert str(exc)
