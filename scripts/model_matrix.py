"""Measure the model-family matrix and record it in docs/runs/model-matrix.json (docs/models.md renders it).

For every tiny family of tests/model/families.py (random weights, built from Transformers' config classes, nothing
downloaded):

* HF engine: whether its greedy answers equal ``model.generate``'s, the largest gap between the log-probs it reports
  for its samples and the actor's on each layout (or the actor's reason for refusing the layout);
* LoRA: what 'all-linear' adapts;
* vLLM (where installed): the same greedy check and padded-layout gap, at the head size vLLM's CPU attention has
  (``families.VLLM_OVERRIDES``), each family in a process of its own; a family vLLM cannot load records vLLM's error;
* FSDP2: two PPO updates on 2 ranks (torchrun, gloo; ``tests/distributed/dp_update_worker.py``) against the same
  updates replicated in one process: the largest parameter difference and the relative gradient-norm difference;
* R3 (MoE families): the routing agreement between the HF engine's recorded routes and the actor, and the
  engine-actor gap with the routes replayed and with the actor routing live; and two R3 ``dapo train`` steps on 2
  FSDP2 ranks with activation checkpointing (torchrun, gloo; ``tests/distributed/test_router_replay_fsdp_torchrun.py``)
  against the same steps replicated on 2 ranks: the lowest routing agreement, the update's agreement in both, and
  the largest weight difference after them.

The same measurements are asserted by tests/model/test_family_matrix.py, tests/model/test_router_replay.py,
tests/distributed/test_data_parallel.py and tests/distributed/test_router_replay_fsdp_torchrun.py. It measures gaps, not timings.

    nice python scripts/model_matrix.py           # rewrite docs/runs/model-matrix.json
    nice python scripts/model_matrix.py --r3-fsdp2  # re-measure only the R3 x FSDP2 figures into the record
    python scripts/render_docs.py                 # then docs/models.md follows

``--r3-fsdp2`` keeps every other figure of the record as it was measured and notes its own date and commit in
``meta["r3_fsdp2"]`` (the table says both).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "tests" / "model")]  # this tree's dapo and its tests
OUT = ROOT / "docs" / "runs" / "model-matrix.json"
LAYOUTS = ("padded", "shared_prompt", "packed")
# The measuring child processes import this tree's dapo too, single-threaded as the tests run.
CHILD_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
}


def measure(family: str) -> dict:
    from families import (
        FAMILIES,
        build_tiny_model,
        engine_actor_gap,
        greedy_mismatches,
        lora_targets,
        r3_measurements,
        sampled_batch,
    )

    spec = FAMILIES[family]
    model = build_tiny_model(family)
    batch, engine_logprobs = sampled_batch(model)
    layouts: dict[str, dict] = {}
    for layout in LAYOUTS:
        try:
            layouts[layout] = {"gap": engine_actor_gap(model, layout, batch, engine_logprobs)}
        except ValueError as exc:
            layouts[layout] = {"refused": str(exc)}
    per_layer = lora_targets(build_tiny_model(family))
    return {
        "config_class": spec.config_class,
        "cache_kinds": list(spec.cache_kinds),
        "moe": spec.moe,
        "attention": model.config._attn_implementation,
        "greedy_equals_generate": greedy_mismatches(model) == [],
        "samples": len(batch),
        "sampled_tokens": sum(len(r) for r in batch.response_ids),
        "response_lengths": sorted(len(r) for r in batch.response_ids),
        "layouts": layouts,
        "lora_all_linear": per_layer,
        "r3": {"hf": r3_measurements(build_tiny_model(family))} if spec.moe else None,
    }


def vllm_column(family: str) -> dict:
    """vLLM on ``family``, in a fresh process (a family vLLM fails on leaves nothing behind): its measurements, or
    ``{"error": vLLM's message}``."""
    with tempfile.TemporaryDirectory() as folder:
        proc = subprocess.run(
            [sys.executable, __file__, "--vllm-family", family, folder],
            capture_output=True,
            text=True,
            timeout=600,
            env=CHILD_ENV,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"the measuring process ended with {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def vllm_child(family: str, folder: str) -> int:
    from families import vllm_measurements

    try:
        result = vllm_measurements(family, Path(folder))
    except Exception as exc:  # vLLM's refusal of the family is the measurement
        text = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        # a pydantic error's first line only names the model; its "Value error, ..." line says what failed
        said = next((line for line in text if line.startswith("Value error, ")), text[0] if text else "")
        said = said.removeprefix("Value error, ").split(" [type=")[0]
        result = {"error": f"{type(exc).__name__}: {said}"[:400]}
    print(json.dumps(result), flush=True)
    return 0


def fsdp2_column(families: list[str]) -> dict[str, dict]:
    """Two PPO updates of each family on 2 FSDP2 ranks (one torchrun launch) against one replicated process."""
    import torch

    from dapo.distributed.world import World
    from tests.distributed.dp_update_worker import launch_command, update

    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        cases = [f"{family}:fsdp2:padded:0::0:{family}" for family in families]
        proc = subprocess.run(
            launch_command(folder, cases),
            capture_output=True,
            text=True,
            timeout=1200,
            env=CHILD_ENV,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"the FSDP2 launch failed: {proc.stderr[-2000:]}")
        torch.set_num_threads(1)
        for family in families:
            one = update(World(), "replicated", "padded", family=family)
            two = torch.load(Path(folder) / f"{family}.pt")
            norm_one, norm_two = one["metrics"]["actor/grad_norm"], two["metrics"]["actor/grad_norm"]
            out[family] = {
                "param_gap": max(float((two["params"][n] - p).abs().max()) for n, p in one["params"].items()),
                "grad_norm_rel_gap": abs(norm_two - norm_one) / norm_one,
                "optimizer_steps": two["metrics"]["actor/num_optimizer_steps"],
            }
    return out


def r3_fsdp2_column(families: list[str]) -> dict[str, dict]:
    """Two R3 steps of each MoE family on 2 FSDP2 ranks (activation checkpointing on) against 2 replicated ranks."""
    from families import save_tiny_model

    from tests.distributed.test_router_replay_fsdp_torchrun import (
        WEIGHT_TOLERANCE,
        largest_weight_gap,
        trained_with_replay,
    )

    out: dict[str, dict] = {}
    for family in families:
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            model = save_tiny_model(family, root / "model", eos_token_ids=range(2, 601, 6))
            replicated, a = trained_with_replay(root, model, "replicated")
            sharded, b = trained_with_replay(root, model, "fsdp2", "actor.gradient_checkpointing=true")
        out[family] = {
            "routing_agreement_min": min(r["moe/routing_agreement"] for r in sharded),
            "update_routing_agreement": [r.get("moe/update_routing_agreement") for r in sharded],
            "update_routing_agreement_replicated": [r.get("moe/update_routing_agreement") for r in replicated],
            "weight_gap": largest_weight_gap(a, b),
            "weight_tolerance": WEIGHT_TOLERANCE,
        }
    return out


def head_commit() -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def r3_fsdp2_only() -> int:
    """Re-measure the R3 x FSDP2 figures of the MoE families into the existing record, the rest untouched."""
    import torch
    import transformers

    record = json.loads(OUT.read_text(encoding="utf-8"))
    families = record["families"]
    for family, result in r3_fsdp2_column([f for f, entry in families.items() if entry["r3"] is not None]).items():
        families[family]["r3"]["fsdp2"] = result
    record["meta"]["r3_fsdp2"] = {
        "date": datetime.date.today().isoformat(),
        "commit": head_commit(),
        "argv": sys.argv,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote the R3 x FSDP2 figures into {OUT.relative_to(ROOT)}")
    return 0


def main() -> int:
    import peft
    import torch
    import transformers
    from families import FAMILIES, GAP_TOLERANCE

    from dapo.rollout.factory import engine_capabilities
    from dapo.rollout.vllm_engine import vllm_available

    commit = head_commit()
    vllm_ok, vllm_version = vllm_available()
    families = {family: measure(family) for family in FAMILIES}
    for family, entry in families.items():
        entry["vllm"] = vllm_column(family) if vllm_ok else {"error": vllm_version}
        if entry["r3"] is not None:
            entry["r3"]["vllm_refused"] = engine_capabilities("vllm").no_routed_experts
    for family, result in fsdp2_column(list(FAMILIES)).items():
        families[family]["fsdp2"] = result
    for family, result in r3_fsdp2_column([f for f, entry in families.items() if entry["r3"] is not None]).items():
        families[family]["r3"]["fsdp2"] = result
    record = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "commit": commit,
            "argv": sys.argv,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "vllm": vllm_version if vllm_ok else None,
            "host": platform.machine(),
            "dtype": "float32",
            "tolerance": GAP_TOLERANCE,
        },
        "families": families,
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--vllm-family"]:
        raise SystemExit(vllm_child(sys.argv[2], sys.argv[3]))
    if sys.argv[1:] == ["--r3-fsdp2"]:
        raise SystemExit(r3_fsdp2_only())
    raise SystemExit(main())
