"""async_training.partial_rollout=true comes with a note on its price, printed before the run (and in --print-config)."""

from __future__ import annotations

from dapo.config.loading import load_config_with_report


def _notices(*overrides: str) -> list[str]:
    return load_config_with_report(None, list(overrides))[1].notices


def test_partial_rollouts_are_noted_with_their_price_and_the_cheaper_mode():
    notes = [
        n
        for n in _notices(
            "async_training.mode=fully_async",
            "async_training.partial_rollout=true",
            "async_training.partial_rollout_chunk_tokens=16",
        )
        if n.startswith("async_training.partial_rollout=true")
    ]
    assert len(notes) == 1
    assert "every 16-token segment" in notes[0] and "one_step_off" in notes[0] and "docs/performance.md" in notes[0]


def test_no_note_without_partial_rollouts():
    assert not any("partial_rollout" in n for n in _notices("async_training.mode=fully_async"))
    assert not any("partial_rollout" in n for n in _notices())
