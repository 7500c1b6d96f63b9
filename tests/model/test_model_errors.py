"""Model-loading refusals name the config key to change: a missing tokenizer path, custom code not trusted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dapo.config import build_config
from dapo.model.loading import EMBEDDED_MODEL_DIR, ModelLoadError, load_policy


def _model_cfg(**overrides: object):
    return build_config({}, [f"model.{k}={v}" for k, v in overrides.items()]).model


@pytest.mark.parametrize("name", ["no-such-tokenizer", "missing/tokenizer/dir", "/no/such/tokenizer"])
def test_missing_tokenizer_path_says_it_does_not_exist(tmp_path: Path, name: str, monkeypatch) -> None:
    # transformers reads a missing path as a Hub id and answers "Repo id must be in the form 'repo_name' ...";
    # none of these is an owner/name model id, so the message is about the path.
    monkeypatch.chdir(tmp_path)  # relative names resolve here, where nothing exists
    with pytest.raises(ModelLoadError) as info:
        load_policy(_model_cfg(tokenizer_path=name))
    assert str(info.value) == f"model.tokenizer_path: '{name}' does not exist"


def test_missing_model_path_of_three_parts_is_a_missing_path_not_a_repo_id(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load_policy(_model_cfg(path="runs/exp/checkpoint"))
    assert str(info.value) == "model.path: 'runs/exp/checkpoint' does not exist"


def _custom_code_model(tmp_path: Path) -> Path:
    """The tiny model, declared as an architecture only its own (custom) Python files define."""
    model_dir = tmp_path / "custom"
    shutil.copytree(EMBEDDED_MODEL_DIR, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["model_type"] = "dapo_custom_arch"
    config["auto_map"] = {
        "AutoConfig": "configuration_custom.CustomConfig",
        "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM",
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    (model_dir / "configuration_custom.py").write_text(
        "from transformers import Qwen2Config\n\n\nclass CustomConfig(Qwen2Config):\n"
        "    model_type = 'dapo_custom_arch'\n"
    )
    (model_dir / "modeling_custom.py").write_text(
        "from transformers import Qwen2ForCausalLM\n\nfrom .configuration_custom import CustomConfig\n\n\n"
        "class CustomForCausalLM(Qwen2ForCausalLM):\n    config_class = CustomConfig\n"
    )
    return model_dir


def test_custom_code_refusal_names_the_config_key(tmp_path: Path) -> None:
    model_dir = _custom_code_model(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load_policy(_model_cfg(path=model_dir))
    message = str(info.value)
    assert str(model_dir) in message and "trust_remote_code" in message
    assert "set model.trust_remote_code=true to allow the custom code in the model folder" in message


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_generate_and_eval_name_their_own_switch_for_custom_code(tmp_path: Path, command: str) -> None:
    from click.testing import CliRunner

    from dapo.cli.main import cli

    model_dir = _custom_code_model(tmp_path)
    args = (
        ["--prompt", "1+1="]
        if command == "generate"
        else ["--test-file", "synth", "--max-problems", "1", "--output", str(tmp_path / "o.jsonl")]
    )
    result = CliRunner().invoke(cli, [command, "--model", str(model_dir), "--device", "cpu", *args])
    assert result.exit_code != 0
    assert "pass --trust-remote-code to allow the custom code" in result.output, result.output
    assert "model.trust_remote_code" not in result.output  # a key these commands do not have
