"""The published figures (README.md, docs/*.md between <!-- generated:NAME --> markers) are exactly what
scripts/render_docs.py renders from the result files recorded in the repository."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
render_docs = importlib.util.module_from_spec(_spec)
sys.modules["render_docs"] = render_docs
_spec.loader.exec_module(render_docs)


def test_every_generated_block_matches_the_recorded_files() -> None:
    stale = render_docs.stale_blocks()
    assert stale == [], f"run `python scripts/render_docs.py`: {stale}"


def test_every_renderer_is_used_and_a_changed_figure_is_caught() -> None:
    texts = {doc: (ROOT / doc).read_text(encoding="utf-8") for doc in render_docs.DOCS}
    used = {m.group(1) for text in texts.values() for m in render_docs.BLOCK.finditer(text)}
    assert used == set(render_docs.RENDERERS)
    readme = texts["README.md"]
    ratio = render_docs.step_ratio("tiny")
    assert ratio in readme
    tampered = readme.replace(f"<!-- generated:readme-vs-trl -->{ratio}", "<!-- generated:readme-vs-trl -->0.21x")
    assert tampered != readme and render_docs.render(tampered) == readme


def test_the_superseded_trl_ratios_are_gone() -> None:
    # README 0.21x / 0.40x and docs/results.md 0.44x / 0.89x contradicted docs/performance.md's recorded run
    for doc, stale in (("README.md", ("0.21x", "0.40x")), ("docs/results.md", ("0.44×", "0.89×"))):
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert not [s for s in stale if s in text], doc


def test_the_mfu_table_fills_from_a_record_that_has_them(monkeypatch) -> None:
    summary = {"dapo": {"perf/mfu/actor": 0.123, "perf/mfu/rollout": 0.045, "perf/tokens_per_s/actor": 5000.0,
                        "perf/tokens_per_s/rollout": 2000.0, "perf/peak_flops/actor": 1.5e11}}
    monkeypatch.setattr(render_docs, "vs_trl_job", lambda key: {"summary": summary})
    table = render_docs.vs_trl_mfu()
    assert "| tiny | 12.3 % | 4.5 % | 5,000 | 2,000 | 1.5e+11 |" in table and "not recorded" not in table
