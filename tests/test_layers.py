"""The package's folders are its layers, and imports only run downwards: read from the source, not from a document.

The floors, lowest first (a layer imports only layers on lower floors; layers on one floor never import each other):

    core, tools  <-  config (a config names core's registered losses and is validated against their entries)  <-
    distributed (world, FSDP2, weight transport)  <-  infra (atomic files, checkpoints: a sharded checkpoint is
    written by every rank)  <-  model, data  <-  rollout (the engines run the model), actor (the update sums gradients
    over the world)  <-  reward (scores a rollout's groups of data prompts), serve (an engine behind an HTTP API),
    distillation (a teacher scores the actor's samples)  <-  evaluation  <-  training  <-  cli

Concrete rollout engines are named only inside rollout/ (everything above builds one through the factory).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dapo"
FLOORS: tuple[tuple[str, ...], ...] = (
    ("core", "tools"),
    ("config",),
    ("distributed",),
    ("infra",),
    ("model", "data"),
    ("rollout", "actor"),
    ("reward", "serve", "distillation"),
    ("evaluation",),
    ("training",),
    ("cli",),
)
LEVEL = {layer: floor for floor, layers in enumerate(FLOORS) for layer in layers}
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
        where = f"{path.relative_to(PACKAGE)} ({importer}, floor {LEVEL[importer]}) imports {name}"
        assert imported in LEVEL, f"{where}: not a layer"
        assert imported == importer or LEVEL[imported] < LEVEL[importer], (
            f"{where} (floor {LEVEL[imported]}): imports run to lower floors only"
        )


def test_every_floor_is_needed() -> None:
    """The floors are the real order, not a wish: each layer above the ground imports some layer on the floor right
    below its own (else it belongs lower), so the declared order is what the import graph forces."""
    imports: dict[str, set[str]] = {}
    for path in modules():
        imports.setdefault(layer_of(path), set()).update(n.split(".")[1] for n in dapo_imports(path))
    for layer, floor in LEVEL.items():
        if floor == 0 or layer not in imports:
            continue
        assert any(LEVEL.get(other) == floor - 1 for other in imports[layer] - {layer}), (
            f"{layer} (floor {floor}) imports nothing from floor {floor - 1}: it belongs on a lower floor"
        )


@pytest.mark.parametrize(
    "path", [p for p in modules() if layer_of(p) != "rollout"], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_module_above_rollout_names_a_concrete_engine(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    named = [name for name in CONCRETE_ENGINES if name in text]
    assert not named, f"{path.relative_to(PACKAGE)} names {named}; build engines with dapo.rollout.factory"
