"""The package's folders are its layers, and imports only run downwards: read from the source, not from a document.

core <- {config} ;  {data, reward, model, rollout, actor, infra, distributed} <- {training, evaluation} <- serve <- cli
Concrete rollout engines are named only inside rollout/ (everything above builds one through the factory).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dapo"
LEVEL = {
    "core": 0, "config": 0,
    "data": 1, "reward": 1, "model": 1, "rollout": 1, "actor": 1, "infra": 1, "distributed": 1, "tools": 1,
    "training": 2, "evaluation": 2,
    "serve": 3,
    "cli": 4,
}
CONCRETE_ENGINES = ("HFRolloutEngine", "VLLMRolloutEngine", "dapo.rollout.hf_engine", "dapo.rollout.vllm_engine")


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE)


def layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def dapo_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name.startswith("dapo.")]


def test_every_folder_is_a_known_layer() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders <= set(LEVEL), f"folders without a layer: {sorted(folders - set(LEVEL))}"
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules loose at src/dapo/: {loose}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_run_downwards(path: Path) -> None:
    importer = layer_of(path)
    for name in dapo_imports(path):
        imported = name.split(".")[1]
        where = f"{path.relative_to(PACKAGE)} ({importer}) imports {name}"
        assert imported in LEVEL, f"{where}: not a layer"
        if imported == importer or LEVEL[imported] < LEVEL[importer]:
            continue
        assert LEVEL[imported] == LEVEL[importer] and _peer_import_allowed(importer, name), (
            f"{where}: imports run downwards (or to the few shared modules of a peer listed in PEER_IMPORTS)")


def _peer_import_allowed(importer: str, name: str) -> bool:
    return any(importer in importers and name == module for importers, module in PEER_IMPORTS)


# Same-level imports that are allowed, and why: a leaf utility, and the plain data types that cross boundaries.
PEER_IMPORTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("data", "reward", "model", "rollout", "actor", "distributed"), "dapo.infra.atomic"),  # the one atomic writer
    (("reward",), "dapo.data.prompts"),  # a scored group holds its PromptItem
    (("reward",), "dapo.rollout.base"),  # scoring reads a RolloutOutput
    (("rollout",), "dapo.model.loading"),  # the factory takes the loaded Policy
    (("rollout",), "dapo.model.attention"),  # the engine runs the model's grouped-query attention while generating
    (("rollout", "actor"), "dapo.model.left_padding"),  # the engine's prefill and the actor's shared-prompt pass
    #                                                    must lay the prompts out alike
    (("infra",), "dapo.distributed.world"),  # a sharded checkpoint is written by every rank of the World
    (("training",), "dapo.evaluation.validation"),  # the loop validates every test_freq steps
    (("actor",), "dapo.distributed.world"),  # the update sums gradients over the ranks of the World
    (("actor",), "dapo.distributed.data_parallel"),  # ...and trains on its share of whole groups
)


@pytest.mark.parametrize("path", [p for p in modules() if layer_of(p) != "rollout"],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_above_rollout_names_a_concrete_engine(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    named = [name for name in CONCRETE_ENGINES if name in text]
    assert not named, f"{path.relative_to(PACKAGE)} names {named}; build engines with dapo.rollout.factory"
