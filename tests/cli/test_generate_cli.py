"""`dapo generate`: question, ground truth and output, as the published inference example prints them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dapo.cli.main import cli
from tests.cli.cli_helpers import flip_middle_byte, save_embedded_checkpoint


def test_generate_from_a_prompt_with_the_dapo_template():
    r = CliRunner().invoke(
        cli,
        [
            "generate",
            "--prompt",
            "Tom has 3 apples and buys 4 more. How many?",
            "--template",
            "dapo",
            "--max-tokens",
            "24",
            "--n",
            "2",
            "--temperature",
            "0",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "[question]" in r.output and "Answer: $Answer" in r.output and "[output 2/2]" in r.output


def test_generate_from_a_file_prints_the_ground_truth(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"Q{i}: 2 + {i}?", "answer": f"#### {2 + i}"}) + "\n" for i in range(3))
    )
    r = CliRunner().invoke(cli, ["generate", "--file", str(path), "--limit", "2", "--max-tokens", "16"])
    assert r.exit_code == 0, r.output
    assert r.output.count("[question]") == 2 and "[ground truth]\n2" in r.output and "[output]" in r.output


def test_generate_needs_exactly_one_source(tmp_path):
    r = CliRunner().invoke(cli, ["generate"])
    assert r.exit_code == 2 and "exactly one of --prompt and --file" in r.output


def _add_index_file(hf: Path) -> None:
    (hf / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda hf: flip_middle_byte(hf / "model.safetensors"), "hf/model.safetensors does not match its checksum"),
        (_add_index_file, "hf/model.safetensors.index.json is not in its manifest.json"),
        (lambda hf: (hf / "generation_config.json").unlink(), "hf/generation_config.json is missing"),
    ],
    ids=["weights damaged", "file added", "file removed"],
)
def test_generate_refuses_a_checkpoint_whose_files_changed_after_the_save(tmp_path, damage, named):
    # Before: the damaged weights were loaded silently (answers of another model), a removed file too.
    ckpt = save_embedded_checkpoint(tmp_path / "checkpoints")
    args = ["generate", "--model", str(ckpt / "hf"), "--prompt", "2 + 3?", "--max-tokens", "4"]
    assert CliRunner().invoke(cli, args).exit_code == 0
    damage(ckpt / "hf")
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert named in r.output and str(ckpt) in r.output and "another checkpoint of the run" in r.output
    assert "[output]" not in r.output


def test_generate_loads_a_plain_model_folder_without_a_manifest(tmp_path):
    import shutil

    from dapo.model.loading import EMBEDDED_MODEL_DIR

    plain = tmp_path / "global_step_3" / "hf"  # named like a checkpoint, but no manifest: a copied-out model
    shutil.copytree(EMBEDDED_MODEL_DIR, plain)
    (plain / "notes.txt").write_text("my own file")
    r = CliRunner().invoke(cli, ["generate", "--model", str(plain), "--prompt", "2 + 3?", "--max-tokens", "4"])
    assert r.exit_code == 0 and "[output]" in r.output, r.output
