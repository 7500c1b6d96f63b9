"""The engine seam: engines differ only through the registry's capabilities, the package's imports form no circle,
and the one model-and-engine loader builds what the commands serve.

Read from the source (the AST), as tests/test_layers.py reads the layers: nothing outside ``src/dapo/rollout/``
compares a value with an engine's name, so adding an engine is one module and one registry line
(docs/extending.md, "Add an engine").
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from dapo.config import ModelConfig, build_config
from dapo.rollout import factory
from dapo.rollout.base import SamplingParams
from dapo.rollout.factory import (
    ENGINE_NAMES,
    ENGINES,
    EngineCapabilities,
    EngineEntry,
    build_rollout_engine,
    default_engine_name,
    engine_capabilities,
    engine_compute_dtype,
    hf_engine_copy,
    module_engine_spec,
)
from dapo.rollout.spec import EngineSpec, VLLMOptions
from tests.test_layers import PACKAGE, layer_of, modules


# ------------------------------------------------------------------------------------------------ from the source
def _names_in(node: ast.AST) -> set[str]:
    """The engine names a compared operand spells: a string constant, or one inside a literal tuple/list/set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and i.value in ENGINE_NAMES}


def engine_name_comparisons(source: str) -> list[str]:
    """Every ``==`` / ``!=`` / ``in`` / ``not in`` comparison (and ``match`` case) against an engine's name, and every
    engine picked by name in a call (``spec.replace(name="hf")``): a decision that belongs to a capability."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg in ("name", "backend") and _names_in(node.value):
            found.append(f"line {node.value.lineno}: {node.arg}={ast.unparse(node.value)}")
        if isinstance(node, ast.Compare):
            if any(_names_in(operand) for operand in (node.left, *node.comparators)):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.MatchValue) and _names_in(node.value):
            found.append(f"line {node.lineno}: case {ast.unparse(node.value)}")
    return found


def test_the_finder_sees_each_kind_of_comparison() -> None:
    source = (
        'a = x == "vllm"\nb = "hf" != y.name\nc = r.name in ("hf", "other")\nd = z == "hfx"\n'
        'match n:\n    case "vllm":\n        pass\ne = replace(spec, name="hf", seed=1)\nf = g(label="hf")\n'
    )
    assert sorted(line.split(":")[0] for line in engine_name_comparisons(source)) == [
        "line 1",
        "line 2",
        "line 3",
        "line 6",
        "line 8",
    ]


@pytest.mark.parametrize(
    "path", [p for p in modules() if layer_of(p) != "rollout"], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_nothing_above_the_registry_compares_an_engine_name(path: Path) -> None:
    found = engine_name_comparisons(path.read_text(encoding="utf-8"))
    assert not found, (
        f"{path.relative_to(PACKAGE)} branches on an engine's name ({'; '.join(found)}); read "
        "dapo.rollout.factory.engine_capabilities instead"
    )


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in it (top level, inside functions, under
    ``TYPE_CHECKING``): ``from dapo.a import b`` is an edge to ``dapo.a.b`` where that is a module, else to ``dapo.a``."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in paths else node.module)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
        graph[name] = {m for m in edges if m in paths and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once all it reaches is known acyclic
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_package_imports_form_no_circle() -> None:
    graph = import_graph()
    assert "dapo.rollout.errors" in graph["dapo.rollout.vllm_engine"]  # the graph sees imports at all
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph) or [])}"


# ------------------------------------------------------------------------------------------------ capabilities
def test_each_registered_engine_declares_what_it_can_do() -> None:
    hf, vllm = engine_capabilities("hf"), engine_capabilities("vllm")
    assert hf == EngineCapabilities(generates_from_module=True, batch_invariant=True)
    assert vllm.tensor_parallel and vllm.reserves_gpu_memory and not vllm.generates_from_module
    assert not vllm.batch_invariant  # rollout.true_on_policy refuses it (tests/training/test_true_on_policy_checks.py)
    assert vllm.auto_dtype == {"cpu": "float32", "cuda": "bfloat16"} and vllm.preferred_on == ("cuda",)
    with pytest.raises(factory.EngineUnavailableError, match="unknown engine 'sglang'"):
        engine_capabilities("sglang")


class ThirdEngine:
    """Registers an engine under a name nothing in the package spells, so that its capabilities alone decide for it;
    it builds the Transformers engine and keeps the specs it was handed."""

    name = "third"

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.built: list[EngineSpec] = []

    def build(self, spec, policy, module):
        self.built.append(spec)
        return ENGINES["hf"].build(spec, policy, module)

    def __call__(self, **capabilities: object) -> str:
        entry = EngineEntry(
            self.build, lambda: (True, ""), EngineCapabilities(**capabilities), "the third engine", "a test's engine"
        )
        self.monkeypatch.setitem(ENGINES, self.name, entry)
        return self.name


@pytest.fixture()
def third_engine(monkeypatch: pytest.MonkeyPatch) -> ThirdEngine:
    return ThirdEngine(monkeypatch)


def test_ranks_per_engine_follow_the_tensor_parallel_capability(third_engine) -> None:
    from dapo.training.generation import engine_tensor_parallel

    name = third_engine(tensor_parallel=True)
    tp = build_config(overrides=["rollout.tensor_model_parallel_size=2"])
    assert engine_tensor_parallel(tp) == 1  # hf: one rank per engine, whatever the key says
    assert engine_tensor_parallel(tp.model_copy(update={"rollout": tp.rollout.model_copy(update={"name": name})})) == 2
    assert (
        engine_tensor_parallel(tp.model_copy(update={"rollout": tp.rollout.model_copy(update={"name": "vllm"})})) == 2
    )


def test_auto_picks_the_first_available_engine_preferred_on_the_device(
    third_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dapo.rollout.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: (False, "not here"))
    assert default_engine_name("cuda") == "hf" and default_engine_name("cpu") == "hf"
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: (True, ""))
    assert default_engine_name("cuda") == "vllm" and default_engine_name("cpu") == "hf"
    third_engine(preferred_on=("cpu",))
    assert default_engine_name("cpu") == "third"


def test_auto_dtype_is_the_capability_s_for_the_device_else_the_actor_s(third_engine) -> None:
    actor = torch.nn.Linear(2, 2).to(torch.float64)
    assert engine_compute_dtype(EngineSpec(name="hf"), actor) == torch.float64
    assert engine_compute_dtype(EngineSpec(name="vllm"), actor) == torch.float32  # on CPU
    assert engine_compute_dtype(EngineSpec(name="vllm", dtype="float16"), actor) == torch.float16
    name = third_engine(auto_dtype={"cpu": "bfloat16", "cuda": "float16"})
    assert engine_compute_dtype(EngineSpec(name=name), actor) == torch.bfloat16


def test_only_a_module_engine_gets_a_copy_of_the_actor(third_engine) -> None:
    actor = torch.nn.Linear(2, 2)
    assert hf_engine_copy(EngineSpec(name="vllm"), actor, sharded=True) is None
    assert hf_engine_copy(EngineSpec(name="hf"), actor, sharded=True) is not None
    assert hf_engine_copy(EngineSpec(name=third_engine(generates_from_module=True)), actor, sharded=True) is not None


def test_a_teacher_is_validated_on_the_module_engine_with_the_students_settings() -> None:
    student = EngineSpec(
        name="vllm", seed=7, max_model_len=99, join_process_group=True, vllm=VLLMOptions(max_num_seqs=3)
    )
    assert module_engine_spec(student) == dataclasses.replace(student, name="hf", join_process_group=False)


def test_no_tensor_parallelism_is_refused_by_capability(third_engine) -> None:
    policy = factory_policy()
    name = third_engine()
    with pytest.raises(
        factory.EngineUnavailableError,
        match=r"rollout.tensor_model_parallel_size=2: the third engine \(rollout.name=third\) has no "
        r"tensor parallelism; use rollout.name=vllm or set it to 1",
    ):
        build_rollout_engine(EngineSpec(name=name, tensor_parallel_size=2), policy)


def test_the_factory_hands_the_builder_its_spec_with_auto_resolved(third_engine) -> None:
    name = third_engine(auto_dtype={"cpu": "bfloat16", "cuda": "bfloat16"})
    spec = EngineSpec(name=name, seed=3, vllm=VLLMOptions(max_num_seqs=5))
    build_rollout_engine(spec, factory_policy()).close()
    assert third_engine.built == [spec.replace(dtype="bfloat16")]


def test_explain_reads_the_precision_and_the_reservation_off_the_capabilities() -> None:
    from dapo.cli.explain_compute import _rollout_precision

    def cfg(*overrides: str):
        return build_config(overrides=list(overrides))

    assert _rollout_precision(cfg(), "fp32") == "fp32"  # hf, auto: the actor's
    assert _rollout_precision(cfg("rollout.dtype=bfloat16"), "fp32") == "bf16"
    assert _rollout_precision(cfg("rollout.name=vllm"), "fp32") == "bf16"  # vllm, auto: bfloat16 on a GPU
    assert _rollout_precision(cfg("rollout.name=vllm", "rollout.dtype=float32"), "bf16") == "fp32"


_POLICY = []


def factory_policy():
    """The embedded tiny policy, loaded once for this file."""
    from dapo.model.loading import load_policy

    if not _POLICY:
        _POLICY.append(load_policy(ModelConfig()))
    return _POLICY[0]


# ------------------------------------------------------------------------------------------------ one loader
def test_auto_device_is_cuda_only_where_torch_sees_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from dapo.infra.device import DEVICE_CHOICES, resolve_device

    assert DEVICE_CHOICES == ("auto", "cpu", "cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cuda") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cpu") == "cpu"


def test_the_loader_resolves_auto_and_builds_the_engine_the_factory_would() -> None:
    from dapo.rollout.loaded_engine import load_model_engine

    loaded = load_model_engine(ModelConfig(), EngineSpec(name="auto", seed=1, max_batch_size=2), device="auto")
    here = build_rollout_engine(EngineSpec(name="hf", max_batch_size=2), factory_policy())
    try:
        # this machine has no GPU: auto is the CPU and the Transformers engine; max_model_len is the model's 512
        assert (loaded.device, loaded.spec.name, loaded.spec.max_model_len) == ("cpu", "hf", 512)
        assert loaded.spec.seed == 1 and loaded.tokenizer is loaded.policy.tokenizer
        assert loaded.engine.model is loaded.policy.model and loaded.engine.max_batch_size == 2
        params = SamplingParams(n=2, max_tokens=6, seed=4)
        assert (
            loaded.engine.generate([[1, 2, 3]], params).response_ids == here.generate([[1, 2, 3]], params).response_ids
        )
    finally:
        loaded.engine.close()
        here.close()
    kept = load_model_engine(ModelConfig(), EngineSpec(name="hf", max_model_len=40))
    assert kept.spec.max_model_len == 40 and kept.device == "cpu"
    kept.engine.close()


def test_serve_and_eval_load_through_the_one_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    import dapo.rollout.loaded_engine as loaded_engine
    from dapo.cli.eval_cmd import build_local_backend
    from dapo.serve.config import ServeConfig
    from dapo.serve.server import load_engine

    calls = []
    real = loaded_engine.load_model_engine

    def recording(model_cfg, spec, **kwargs):
        calls.append((model_cfg.path, spec, kwargs))
        return real(model_cfg, spec, **kwargs)

    monkeypatch.setattr(loaded_engine, "load_model_engine", recording)
    engine, tokenizer, max_len, backend = load_engine(ServeConfig(max_batch_rows=8, seed=2))
    engine.close()
    local, name = build_local_backend(None, "auto", "auto", 16, None, 100, 5)
    local.close()
    assert (max_len, backend, name) == (512, "hf", "hf")
    assert [(path, spec) for path, spec, _ in calls] == [
        (None, EngineSpec(name="auto", seed=2, max_batch_size=8)),
        (None, EngineSpec(name="auto", seed=5, max_model_len=116)),
    ]
    assert calls[0][2] == {"device": "auto"}
    assert calls[1][2] == {"device": "auto", "remote_code_switch": "pass --trust-remote-code"}
