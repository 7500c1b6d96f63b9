"""`dapo generate`: question, ground truth and output, as the published inference example prints them."""

from __future__ import annotations

import json

from click.testing import CliRunner

from dapo.cli.main import cli


def test_generate_from_a_prompt_with_the_dapo_template():
    r = CliRunner().invoke(cli, ["generate", "--prompt", "Tom has 3 apples and buys 4 more. How many?",
                                 "--template", "dapo", "--max-tokens", "24", "--n", "2", "--temperature", "0"])
    assert r.exit_code == 0, r.output
    assert "[question]" in r.output and "Answer: $Answer" in r.output and "[output 2/2]" in r.output


def test_generate_from_a_file_prints_the_ground_truth(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question": f"Q{i}: 2 + {i}?", "answer": f"#### {2 + i}"}) + "\n"
                            for i in range(3)))
    r = CliRunner().invoke(cli, ["generate", "--file", str(path), "--limit", "2", "--max-tokens", "16"])
    assert r.exit_code == 0, r.output
    assert r.output.count("[question]") == 2 and "[ground truth]\n2" in r.output and "[output]" in r.output


def test_generate_needs_exactly_one_source(tmp_path):
    r = CliRunner().invoke(cli, ["generate"])
    assert r.exit_code == 2 and "exactly one of --prompt and --file" in r.output
