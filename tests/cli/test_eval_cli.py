"""`dapo eval` through the real CLI with the embedded tiny model: table, files, resume, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dapo.cli.main import cli
from tests.harness.ports import free_port

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
FAST = ["--max-problems", "4", "--n", "2", "--max-tokens", "24", "--quiet"]


def _run(args):
    result = CliRunner().invoke(cli, ["eval", *args])
    return result


def test_eval_synth_writes_samples_summary_and_table(tmp_path):
    out = tmp_path / "s.jsonl"
    r = _run(["--test-file", "synth", "--output", str(out), *FAST])
    assert r.exit_code == 0, r.output
    assert "avg@2" in r.output and "pass@2" in r.output and "maj@2" in r.output and "synth_arith" in r.output
    assert len(out.read_text().splitlines()) == 8
    summary = json.loads((tmp_path / "s.summary.json").read_text())
    assert summary["status"] == "complete" and summary["metrics"]["overall"]["problems"] == 4


def test_eval_resumes_from_its_output_file(tmp_path):
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    assert _run(["--test-file", "synth", "--output", str(full), "--batch-size", "2", *FAST]).exit_code == 0
    assert _run(["--test-file", "synth", "--output", str(part), "--batch-size", "2", *FAST]).exit_code == 0
    lines = part.read_text().splitlines(keepends=True)
    part.write_text("".join(lines[:5]) + lines[5][:10])  # killed mid-write
    r = _run(["--test-file", "synth", "--output", str(part), "--batch-size", "2", *FAST])
    assert r.exit_code == 0, r.output
    a = json.loads((tmp_path / "full.summary.json").read_text())
    b = json.loads((tmp_path / "part.summary.json").read_text())
    assert a["metrics"] == b["metrics"] and b["status"] == "complete"
    r = _run(["--test-file", "synth", "--output", str(part), "--batch-size", "2", "--temperature", "0.5", *FAST])
    assert r.exit_code != 0 and "other settings" in r.output


def test_eval_unreachable_base_url_names_it(tmp_path):
    port = free_port()
    r = _run(
        [
            "--test-file",
            "synth",
            "--base-url",
            f"http://127.0.0.1:{port}",
            "--max-retries",
            "0",
            "--output",
            str(tmp_path / "o.jsonl"),
            *FAST,
        ]
    )
    assert r.exit_code != 0 and f"cannot reach the server at http://127.0.0.1:{port}/v1" in r.output


def test_eval_bad_test_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"foo": 1}\n')
    r = _run(["--test-file", str(bad), "--output", str(tmp_path / "o.jsonl"), *FAST])
    assert r.exit_code != 0 and "Error" in r.output and "Traceback" not in r.output


@pytest.mark.shared_data
@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (the shared data sets)")
def test_eval_official_aime_file_a_handful_of_problems(tmp_path):
    out = tmp_path / "aime.jsonl"
    args = [
        "--test-file",
        str(SHARED / "aime-2024.parquet"),
        "--max-problems",
        "2",
        "--max-tokens",
        "8",
        "--output",
        str(out),
        "--quiet",
    ]
    r = _run(args)
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "aime.summary.json").read_text())
    overall = summary["metrics"]["overall"]
    assert overall["problems"] == 2 and overall["samples"] == 64 and "avg@32" in overall
    assert 0.0 <= overall["truncation_rate"] <= 1.0 and overall["avg@32"] == 0.0  # the tiny model cannot do AIME
    before = out.read_text()
    assert _run(args).exit_code == 0 and out.read_text() == before  # resumed: nothing regenerated


def test_eval_unwritable_output_is_one_line_naming_the_path(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the output's folder should be\n")
    out = blocker / "s.jsonl"
    r = _run(["--test-file", "synth", "--output", str(out), *FAST])
    assert r.exit_code != 0
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # no traceback escapes
    assert "not-a-dir" in r.output and "failed:" in r.output, r.output


def test_each_checkpoint_gets_its_own_default_output():
    from dapo.cli.eval_cmd import default_output

    step_30 = default_output("runs/x/checkpoints/global_step_30/hf", ("synth",))
    step_40 = default_output("runs/x/checkpoints/global_step_40/hf/", ("synth",))
    assert step_30 == Path("runs/eval/x-global_step_30__synth.jsonl")  # was runs/eval/hf__synth.jsonl for both
    assert step_40 == Path("runs/eval/x-global_step_40__synth.jsonl")
    assert default_output("/models/Qwen2.5-7B", ("data/aime-2024.parquet",)) == Path(
        "runs/eval/Qwen2.5-7B__aime-2024.jsonl"
    )


def test_a_multi_turn_evaluation_gets_its_own_default_output():
    """The README's single- and multi-turn lines on one model and set, in a row: the second must not resume the
    first's file (and be refused for other settings)."""
    from dapo.cli.eval_cmd import default_output

    assert default_output(None, ("aime-2024.parquet",), multi_turn=True) == Path(
        "runs/eval/tiny-qwen2__aime-2024__multi-turn.jsonl"
    )
    assert default_output(None, ("aime-2024.parquet",)) == Path("runs/eval/tiny-qwen2__aime-2024.jsonl")


# ---- the multi-turn tool loop --------------------------------------------------------------------------------------

CALCULATOR = str(Path(__file__).resolve().parents[2] / "configs" / "tools" / "tiny_calculator.yaml")


def test_eval_runs_the_training_tool_loop_and_resumes_it(tmp_path):
    """--synth-config of a multi-turn preset turns the tool loop on, as `dapo train` validates: the tiny model's
    "a + b =" lines are computed by the sandboxed interpreter, every sample records its calls, the summary has
    tool/*, and a resumed run ends as an uninterrupted one."""
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    args = [
        "--test-file",
        "synth",
        "--synth-config",
        CALCULATOR,
        "--batch-size",
        "2",
        "--max-problems",
        "4",
        "--n",
        "2",
        "--max-tokens",
        "48",
        "--quiet",
    ]
    r = _run([*args, "--output", str(full)])
    assert r.exit_code == 0, r.output
    assert "multi-turn: up to 3 turns" in r.output and "tool/samples_with_call" in r.output
    rows = [json.loads(line) for line in full.read_text().splitlines()]
    assert len(rows) == 8 and all(isinstance(row["tool_calls"], list) for row in rows)
    called = [row for row in rows if row["tool_calls"]]
    assert len(called) >= 4 and all(set(row["tool_calls"]) == {"ok"} for row in called)  # "a + b" evaluates
    summary = json.loads((tmp_path / "full.summary.json").read_text())
    overall = summary["metrics"]["overall"]
    assert overall["tool/samples_with_call"] == pytest.approx(len(called) / 8)
    assert overall["tool/calls"] == sum(len(row["tool_calls"]) for row in rows)
    assert summary["settings"]["multi_turn"]["tool_call_end"] == "="

    assert _run([*args, "--output", str(part)]).exit_code == 0
    lines = part.read_text().splitlines(keepends=True)
    part.write_text("".join(lines[:3]) + lines[3][:20])  # killed mid-write
    assert _run([*args, "--output", str(part)]).exit_code == 0
    assert (
        part.read_text() != ""
        and json.loads((tmp_path / "part.summary.json").read_text())["metrics"] == summary["metrics"]
    )
    r = _run([*args, "--output", str(part), "--max-assistant-turns", "2"])
    assert r.exit_code != 0 and "other settings" in r.output and "multi_turn" in r.output

    single = tmp_path / "single.jsonl"
    r = _run([*args, "--single-turn", "--output", str(single)])
    assert r.exit_code == 0, r.output
    assert not any("tool_calls" in json.loads(line) for line in single.read_text().splitlines())
    assert "tool/" not in r.output


def test_eval_multi_turn_against_a_server_is_refused(tmp_path):
    r = _run(
        [
            "--test-file",
            "synth",
            "--multi-turn",
            "--base-url",
            "http://127.0.0.1:9",
            "--output",
            str(tmp_path / "o.jsonl"),
            *FAST,
        ]
    )
    assert r.exit_code != 0 and "--multi-turn runs the tool loop on a local engine" in r.output


def test_eval_refuses_a_checkpoint_whose_merged_model_is_another_one(tmp_path):
    # Before: a LoRA checkpoint whose hf/merged/ had been replaced by another model's folder was evaluated silently
    # (the other model's score reported as this checkpoint's).
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo.model.loading import EMBEDDED_MODEL_DIR
    from tests.cli.cli_helpers import save_embedded_checkpoint

    ckpt = save_embedded_checkpoint(tmp_path / "run" / "checkpoints", lora=True)
    args = ["--model", str(ckpt / "hf"), "--test-file", "synth", "--output", str(tmp_path / "o.jsonl"), *FAST]
    assert _run(args).exit_code == 0  # the checkpoint as saved evaluates
    merged = ckpt / "hf" / "merged"
    other = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL_DIR)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.01)
    shutil.rmtree(merged)
    other.save_pretrained(merged)
    AutoTokenizer.from_pretrained(EMBEDDED_MODEL_DIR).save_pretrained(merged)
    r = _run([*args[: -len(FAST)], "--output", str(tmp_path / "o2.jsonl"), *FAST])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert "hf/merged/model.safetensors does not match its checksum" in r.output and str(ckpt) in r.output
    assert "another checkpoint of the run" in r.output and "resume" not in r.output
    assert not (tmp_path / "o2.jsonl").exists()


def test_eval_budget_fits_the_tiny_models_context_or_is_refused(tmp_path):
    """The embedded model has 512 positions: with no --max-tokens the budget is what the longest prompt leaves (the
    recorded setting, below 1024); 20480 is refused before any sample, naming the context and what fits."""
    out = tmp_path / "s.jsonl"
    r = _run(["--test-file", "synth", "--output", str(out), "--max-problems", "2", "--n", "1", "--quiet"])
    assert r.exit_code == 0, r.output
    budget = json.loads((tmp_path / "s.summary.json").read_text())["settings"]["max_tokens"]
    assert 0 < budget < 512
    r = _run(
        [
            "--test-file",
            "synth",
            "--output",
            str(tmp_path / "t.jsonl"),
            "--max-problems",
            "2",
            "--n",
            "1",
            "--max-tokens",
            "20480",
            "--quiet",
        ]
    )
    assert r.exit_code != 0 and "512-token context" in r.output and f"--max-tokens {budget} or less" in r.output
    assert not (tmp_path / "t.jsonl").exists()
