"""Every ground truth of the real data sets in ../shared/data scores +1 against a response stating it
(skipped when that folder is absent, as in a fresh clone)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dapo.reward.batch import RewardInput, score_batch
from dapo.reward.gsm8k import gsm8k_score
from dapo.reward.math_dapo import compute_score

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data sets not available: {SHARED_DATA.resolve()} does not exist")
    return SHARED_DATA.resolve()


@pytest.mark.parametrize("name", ["aime-2024.parquet", "dapo-math-17k.dedup.parquet"])
def test_every_ground_truth_scores_plus_one(shared_data: Path, name: str) -> None:
    table = pq.read_table(shared_data / name, columns=["data_source", "reward_model"]).to_pylist()
    truths = [(row["data_source"], row["reward_model"]["ground_truth"]) for row in table]
    items = [RewardInput(source, "Let me think.\n...\nAnswer: " + truth, truth) for source, truth in truths]
    results = score_batch(items)  # routed by each row's own data_source ("math_dapo", "DAPO-17k")
    failures = [(it.ground_truth, r) for it, r in zip(items, results) if not (r.acc and r.score == 1.0)]
    assert not failures, failures[:10]
    # ... and a different integer scores -1.
    wrong = [compute_score("Answer: " + str(int(it.ground_truth) + 1), it.ground_truth) for it in items[:500]]
    assert all(w["score"] == -1.0 for w in wrong)


def test_every_math500_answer_matches_itself_exactly(shared_data: Path) -> None:
    rows = [json.loads(line) for line in (shared_data / "math500.jsonl").read_text(encoding="utf-8").splitlines()]
    failures = [r["answer"] for r in rows if not compute_score("So\nAnswer: " + r["answer"], r["answer"])["acc"]]
    assert not failures
    boxed = [r["answer"] for r in rows if not compute_score("\\boxed{" + r["answer"] + "}", r["answer"], True)["acc"]]
    assert not boxed


def test_every_gsm8k_test_answer_scores_plus_one(shared_data: Path) -> None:
    rows = [json.loads(line) for line in (shared_data / "gsm8k-test.jsonl").read_text(encoding="utf-8").splitlines()]
    # The reference solution itself ends with "#### N", so it is a correct response.
    assert all(gsm8k_score(r["answer"], r["answer"])["acc"] for r in rows)
