#!/usr/bin/env bash
# Set up every real engine the integration tests use, then write the manifest they read.
# Order: llama.cpp (the long build), its GGUF model, vLLM's venv, then the HF model (made with that
# venv's transformers). Every step is cached; a warm run takes seconds. `make engines` calls this.
# The manifest ($CACHE/engines.json) is written last, so tests skip cleanly unless every step finished.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${TAILGUARD_CACHE:-$HOME/.cache/tailguard}"
PROJECT_PY="${PROJECT_PY:-$HERE/../.venv/bin/python}"
MANIFEST="$CACHE/engines.json"
export TAILGUARD_CACHE="$CACHE"
mkdir -p "$CACHE"

step() {  # step NAME CMD...: run, time it, keep its last stdout line (the path it prints)
    local name="$1"; shift
    local t0=$SECONDS out
    out="$("$@")" || { echo "engines: $name failed" >&2; exit 1; }
    echo "engines: $name ready in $((SECONDS - t0)) s: ${out##*$'\n'}" >&2
    printf '%s' "${out##*$'\n'}"
}

rm -f "$MANIFEST.tmp"
LLAMA_SERVER="$(step llama-server bash "$HERE/llamacpp.sh")"
GGUF_MODEL="$(step gguf-model "$PROJECT_PY" "$HERE/make_gguf.py" --preset tiny)"
GGUF_MODEL_SLOW="$(step gguf-model-slow "$PROJECT_PY" "$HERE/make_gguf.py" --preset slow)"
VLLM_PYTHON="$(step vllm bash "$HERE/vllm.sh")"
HF_MODEL="$(step hf-model "$VLLM_PYTHON" "$HERE/make_hf_llama.py" --preset small)"

"$PROJECT_PY" - "$MANIFEST" "$LLAMA_SERVER" "$GGUF_MODEL" "$GGUF_MODEL_SLOW" "$VLLM_PYTHON" "$HF_MODEL" <<'PY'
import json, os, sys
path, llama_server, gguf_model, gguf_model_slow, vllm_python, hf_model = sys.argv[1:]
doc = {"llama_server": llama_server, "gguf_model": gguf_model, "gguf_model_slow": gguf_model_slow,
       "vllm_python": vllm_python, "hf_model": hf_model}
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=2)
os.replace(path + ".tmp", path)
PY
echo "engines: manifest $MANIFEST" >&2
