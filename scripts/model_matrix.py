"""Measure the model-family matrix and record it in docs/runs/model-matrix.json (docs/models.md renders it).

For every tiny family of tests/model/families.py (random weights, built from Transformers' config classes, nothing
downloaded): whether the HF engine's greedy answers equal ``model.generate``'s, the largest gap between the log-probs
the engine reports for its samples and the actor's on each layout (or the actor's reason for refusing the layout),
and what LoRA's 'all-linear' adapts. The same measurements are asserted by tests/model/test_family_matrix.py.

    python scripts/model_matrix.py                 # rewrite docs/runs/model-matrix.json
    python scripts/render_docs.py                  # then docs/models.md follows
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "model"))
OUT = ROOT / "docs" / "runs" / "model-matrix.json"
LAYOUTS = ("padded", "shared_prompt", "packed")


def measure(family: str) -> dict:
    from families import FAMILIES, build_tiny_model, engine_actor_gap, greedy_mismatches, lora_targets, sampled_batch

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
        # Not measured by this script (yet): the table says so rather than leaving them out.
        "fsdp2": None,
        "vllm": None,
        "r3": None,
    }


def main() -> int:
    import peft
    import torch
    import transformers
    from families import FAMILIES, GAP_TOLERANCE

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    record = {
        "meta": {
            "date": datetime.date.today().isoformat(),
            "commit": commit,
            "argv": sys.argv,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "host": platform.machine(),
            "dtype": "float32",
            "tolerance": GAP_TOLERANCE,
        },
        "families": {family: measure(family) for family in FAMILIES},
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
