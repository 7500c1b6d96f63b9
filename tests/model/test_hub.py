"""Hub ids for model.path and data files resolve through a (fake) Hugging Face cache; offline, a missing id stops
with a message saying how to fetch it. No test touches the network (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo.config import load_config
from dapo.model.hub import (
    HubResolveError,
    looks_like_hub_id,
    resolve_data_config,
    resolve_data_file,
    resolve_model_path,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_cache(cache: Path, kind: str, repo_id: str, files: dict[str, str]) -> Path:
    """The cache layout huggingface_hub reads: <kind>s--owner--name/{refs/main, snapshots/<commit>/...}."""
    repo = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    for name, text in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_text(text)
    return snap


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_hub_id_shapes(tmp_path: Path):
    assert looks_like_hub_id("Qwen/Qwen2.5-Math-7B") and looks_like_hub_id("BytedTsinghua-SIA/AIME-2024/data/x.parquet")
    assert not looks_like_hub_id("./Qwen/Qwen2.5") and not looks_like_hub_id("/abs/path") and not looks_like_hub_id("x")
    local = tmp_path / "a" / "b"
    local.mkdir(parents=True)
    assert not looks_like_hub_id(str(local))
    assert not looks_like_hub_id("data/train.parquet")  # folder/file: a local path even when missing


def test_model_id_resolves_from_the_cache(tmp_path: Path):
    snap = fake_cache(tmp_path, "model", "Qwen/Qwen2.5-Math-7B", {"config.json": "{}"})
    assert resolve_model_path("Qwen/Qwen2.5-Math-7B", cache_dir=tmp_path) == snap
    assert resolve_model_path(str(tmp_path), cache_dir=tmp_path) == tmp_path  # local paths pass through


def test_dataset_id_resolves_to_its_files(tmp_path: Path):
    snap = fake_cache(
        tmp_path, "dataset", "BytedTsinghua-SIA/DAPO-Math-17k", {"data/dapo-math-17k.parquet": "x", "README.md": "y"}
    )
    assert resolve_data_file("BytedTsinghua-SIA/DAPO-Math-17k", cache_dir=tmp_path) == [
        snap / "data" / "dapo-math-17k.parquet"
    ]
    assert resolve_data_file("BytedTsinghua-SIA/DAPO-Math-17k/data/dapo-math-17k.parquet", cache_dir=tmp_path) == [
        snap / "data" / "dapo-math-17k.parquet"
    ]


def test_offline_message_when_the_cache_lacks_the_id(tmp_path: Path):
    with pytest.raises(HubResolveError) as err:
        resolve_model_path("Qwen/Qwen2.5-32B", cache_dir=tmp_path)
    msg = str(err.value)
    assert "'Qwen/Qwen2.5-32B' is not in the Hugging Face cache" in msg and "HF_HUB_OFFLINE" in msg
    assert "huggingface-cli download Qwen/Qwen2.5-32B" in msg
    with pytest.raises(HubResolveError, match="--repo-type dataset"):
        resolve_data_file("BytedTsinghua-SIA/AIME-2024", cache_dir=tmp_path)


def test_data_config_hub_ids_become_local_files(tmp_path: Path):
    snap = fake_cache(tmp_path, "dataset", "BytedTsinghua-SIA/AIME-2024", {"data/aime-2024.parquet": "x"})
    data = load_config(
        None, ["data.train_files=local/train.parquet", "data.val_files=BytedTsinghua-SIA/AIME-2024"]
    ).data
    resolved = resolve_data_config(data, cache_dir=tmp_path)
    assert resolved.train_files == ["local/train.parquet"]
    assert resolved.val_files == [str(snap / "data" / "aime-2024.parquet")]
