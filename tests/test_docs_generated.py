"""The published figures (README.md, docs/*.md between <!-- generated:NAME --> markers) are exactly what
scripts/render_docs.py renders from the result files recorded in the repository."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

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
    summary = {
        "dapo": {
            "perf/mfu/actor": 0.123,
            "perf/mfu/rollout": 0.045,
            "perf/tokens_per_s/actor": 5000.0,
            "perf/tokens_per_s/rollout": 2000.0,
            "perf/peak_flops/actor": 1.5e11,
        }
    }
    runs = [
        {"program": "dapo", "steps": [{"perf": {"perf/peak_flops/rollout": 6e11}}] * 2},
        {"program": "trl", "steps": [{}]},
    ]  # a bf16 engine's steps log the bf16 peak
    monkeypatch.setattr(render_docs, "vs_trl_job", lambda key: {"summary": summary, "runs": runs})
    table = render_docs.vs_trl_mfu()
    assert "| tiny | 12.3 % | 4.5 % | 5,000 | 2,000 | 1.5e+11 / 6e+11 |" in table and "not recorded" not in table


def test_the_profile_table_is_computed_from_the_profile_and_the_runs_metrics(monkeypatch) -> None:
    def phase(wall: float, mm: float, addmm: float) -> dict:
        return {
            "wall_s": wall,
            "runs": 1,
            "by_shape": [],
            "operators": [
                {"op": "aten::mm", "self_s": mm},
                {"op": "aten::addmm", "self_s": addmm},
                {"op": "aten::mul", "self_s": 9.0},
            ],
        }

    def step(n: int, scale: float) -> dict:
        return {
            "step": n,
            "timing_s/gen": 3.0 * scale,
            "timing_s/update_actor": 8.0 * scale,
            "perf/flops/rollout": 1e11 * scale,
            "perf/flops/actor": 4e11 * scale,
            "perf/mfu/rollout": 0.1 * scale,
            "perf/mfu/actor": 0.2 * scale,
            "perf/tokens_per_s/rollout": 100.0 * scale,
            "perf/tokens_per_s/actor": 300.0 * scale,
            "perf/peak_flops/actor": 2e11,
        }

    profile = {"step": 2, "phases": {"gen": phase(4.0, 1.5, 0.5), "update_actor": phase(10.0, 4.0, 0.0)}}
    meta = {"date": "D", "commit": "C", "host_cpu": "H", "load": "L", "command": "dapo train"}
    monkeypatch.setattr(render_docs, "profile_run", lambda: (meta, profile, [step(1, 1.0), step(2, 1.0), step(3, 2.0)]))
    table = render_docs.profile_phases()
    # gen: products 1.5 + 0.5 = 2.0 s of 4.0 (50 %); step 2's 1e11 model FLOPs over them: 50 GFLOP/s
    assert (
        "| generation (engine) | 3.0 / 6.0 | 4.0 | 2.0 (50 %) | 50 | 1.00e+11 / 2.00e+11 | 10.0 % / 20.0 % | 100 / 200 |"
        in table
    ), table
    # update: 4.0 s of products of 10.0 (40 %); 4e11 FLOPs over 4.0 s: 100 GFLOP/s
    assert "| update (actor) | 8.0 / 16.0 | 10.0 | 4.0 (40 %) | 100 |" in table
    assert "unprofiled steps (1, 3)" in table and "against 200 GFLOP/s" in table


def test_the_serving_table_and_ratios_come_from_the_record(monkeypatch) -> None:
    def row(target, clients, ttft):
        return {
            "target": target,
            "clients": clients,
            "ttft_p50_ms": ttft,
            "ttft_p99_ms": 2 * ttft,
            "itl_p50_ms": 3.0,
            "itl_p99_ms": 4.0,
            "chunks_per_token": 1.0,
            "tokens_per_s": 100.0,
            "requests": 8,
            "failed": 0,
            "wall_s": 1.0,
            "timed_out": False,
        }

    record = {
        "meta": {
            "started": "2030-01-02T03:04:05Z",
            "argv": ["benchmarks/bench_serve.py", "--out", "x.json", "--clients", "1,4"],
            "commit": "abc1234",
            "cpu": "a CPU",
            "cpu_count": 2,
            "load_average_at_start": [1.5, 2.0, 2.5],
            "versions": {"torch": "9.9", "vllm": None},
            "note": "shared machine",
        },
        "rows": [row("dapo-hf", 1, 30.0), row("dapo-hf", 4, 50.0), row("vllm", 1, 10.0), row("vllm", 4, 25.0)],
    }
    monkeypatch.setattr(render_docs, "bench_ttft", lambda: record)
    text = render_docs.serving_ttft()
    assert "| `dapo serve` (Transformers) | 4 | 50.0 / 100.0 | 3.0 / 4.0 | 1.00 | 100 | 8 (0) |" in text
    assert "3.0x at 1 client, 2.0x at 4 clients" in text
    assert "`python benchmarks/bench_serve.py --clients 1,4`" in text and "x.json" not in text
    assert "torch 9.9." in text and "vllm" not in text.split("Recorded:")[1] and "Shared machine." in text


def test_no_document_holds_more_hand_typed_figures_than_pending_counts() -> None:
    problems = render_docs.unsourced_figures()
    assert problems == [], problems


def test_a_hand_typed_figure_outside_a_generated_block_is_found_and_code_and_settings_are_not() -> None:
    text = (
        "Prose: 3.1 s per step, 0.97x the other, 43% of tokens, 2.2 GB peak, +4.1 points, 439 tokens/s, "
        "0.38 -> 0.86.\nA shape is not a ratio: 8 x 8, 768 x 768. Versions and names neither: Qwen2.5-32B, vllm "
        "0.32.0, 2.4.6 -> 2.3.5.\n"
        "<!-- generated:x -->12.0 s<!-- /generated --> and `--timeout 10 s` and\n```\ndone: 30 steps in 73 s\n```\n"
        "a setting: the timeout (default 300 s).\n"
    )
    found = render_docs.hand_typed_figures("docs/x.md", text)
    assert found == [
        "1: 3.1 s",
        "1: 0.97x",
        "1: 43%",
        "1: 2.2 GB",
        "1: 4.1 points",
        "1: 439 tokens/s",
        "1: 0.38 -> 0.86",
        "7: 300 s",
    ]
    render_docs.NOT_MEASURED["docs/x.md"] = ("(default\n300 s)",)  # matched across a line break
    try:
        assert render_docs.hand_typed_figures("docs/x.md", text) == found[:-1]
        render_docs.NOT_MEASURED["docs/x.md"] = ("(default 600 s)",)
        with pytest.raises(KeyError, match="no longer holds"):
            render_docs.hand_typed_figures("docs/x.md", text)
    finally:
        del render_docs.NOT_MEASURED["docs/x.md"]


def test_a_figure_typed_by_hand_is_named_and_a_rendered_one_is_not(tmp_path, monkeypatch) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "took 5 s and 6 s\n<!-- generated:x -->took 7 s<!-- /generated -->\n", encoding="utf-8"
    )
    monkeypatch.setattr(render_docs, "DOCS", ("docs/a.md",))
    (problem,) = render_docs.unsourced_figures(tmp_path)
    assert "docs/a.md: 2 figures typed by hand" in problem and "1: 5 s, 1: 6 s" in problem and "7 s" not in problem
    (tmp_path / "docs" / "a.md").write_text("<!-- generated:x -->took 7 s<!-- /generated -->\n", encoding="utf-8")
    assert render_docs.unsourced_figures(tmp_path) == []


def test_the_serving_ratios_pair_rows_of_one_command_only(monkeypatch) -> None:
    def row(target, clients, tokens_per_s, ttft):
        return {
            "target": target,
            "clients": clients,
            "requests_per_s": 1.0,
            "tokens_per_s": tokens_per_s,
            "ttft_p50_ms": ttft,
            "ttft_p99_ms": ttft,
            "itl_p50_ms": 1.0,
            "itl_p99_ms": 2.0,
            "failed": 0,
        }

    commands = ["python b.py --targets vllm,dapo-hf --clients 64", "python b.py --targets dapo-vllm --clients 8,64"]
    rows = [
        row("vllm", 64, 80.0, 100.0),
        row("dapo-hf", 64, 60.0, 300.0),
        row("dapo-vllm", 8, 40.0, 50.0),
        row("dapo-vllm", 64, 78.0, 90.0),
    ]
    monkeypatch.setattr(render_docs, "BENCH_SERVE", {"m": "x.json"})
    monkeypatch.setattr(render_docs, "bench_serve", lambda key: (commands, rows))
    text = render_docs.serving_load()
    assert "| dapo-vllm | m | 2 | 8 / 64 | 1.00 / 1.00 | 40.0 / 78.0 |" in text
    # dapo-hf against vllm in command 1: 60 / 80 = 0.75x, 300 / 100 = 3.0x; dapo-vllm's 78 is never set against 80
    assert "m dapo-hf at 64: 0.75x the tokens/s, 3.0x the median TTFT" in text
    assert "m dapo-vllm: no `vllm serve` row in its command, so no ratio" in text and "0.97x" not in text
