"""Clean-up never hides the error that ended a run, and data files are checked before the model is loaded.

In process, so that the faults can be injected where no user input reaches: a rollout engine and a reward scorer
whose ``close()`` raises (a dead worker, a vanished device), and a model loader that must not be called at all.
"""

from __future__ import annotations

import logging

import pytest

from dapo.config import build_config
from dapo.data.schema import DataValidationError
from dapo.reward.batch import RewardScorer
from dapo.reward.pool import RewardScoringError
from dapo.rollout.hf_engine import HFRolloutEngine
from dapo.training import loop, run
from tests.cli.cli_helpers import FAST


def _close_then_raise(cls, message: str):
    original = cls.close

    def close(self) -> None:
        original(self)  # release the real workers first: only the report of the close is faulty
        raise OSError(5, message)

    return close


def test_a_failing_close_is_a_warning_and_the_run_error_propagates(tmp_path, monkeypatch, caplog) -> None:
    broken = tmp_path / "broken_reward.py"
    broken.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    raise ValueError('this scorer is broken')\n"
    )
    cfg = build_config(
        {},
        [
            *FAST,
            f"trainer.default_local_dir={tmp_path}",
            "trainer.progress=false",
            f"custom_reward_function.path={broken}",
            "trainer.val_before_train=false",
        ],
    )
    monkeypatch.setattr(HFRolloutEngine, "close", _close_then_raise(HFRolloutEngine, "engine device gone"))
    monkeypatch.setattr(RewardScorer, "close", _close_then_raise(RewardScorer, "scorer worker gone"))
    with caplog.at_level(logging.WARNING, logger="dapo.infra.cleanup"), pytest.raises(RewardScoringError) as info:
        loop.train(cfg)
    assert "this scorer is broken" in str(info.value)  # the error that ended the run, not a close() error
    warnings = [r.getMessage() for r in caplog.records if r.name == "dapo.infra.cleanup"]
    # both closes were attempted, each failure said once, in order
    assert [w.split(" failed")[0] for w in warnings if w.startswith("closing")] == [
        "closing the reward scorer",
        "closing the rollout engine",
    ]
    assert any("scorer worker gone" in w for w in warnings) and any("engine device gone" in w for w in warnings)


def test_bad_data_is_reported_before_the_model_is_loaded(tmp_path, monkeypatch) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"data_source": "x", "prompt": [{"role": "user", "content": "1+1?"}]}\n')

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the data files were checked")

    monkeypatch.setattr(run, "load_policy", no_model)
    cfg = build_config({}, [*FAST, f"trainer.default_local_dir={tmp_path}", f"data.train_files=[{bad}]"])
    with pytest.raises(DataValidationError, match=r"bad\.jsonl, row 0 \(line 1\), field 'reward_model"):
        loop.train(cfg)
