#!/usr/bin/env bash
# Configures and builds the project into build/ (or $PS_BUILD_DIR).
#   scripts/build.sh [extra cmake -D options]
# CUDA is detected (PS_WITH_CUDA=AUTO): nvcc is looked for on PATH and at /usr/local/cuda/bin.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PS_BUILD_DIR:-$root/build}"
jobs="${PS_BUILD_JOBS:-$(nproc)}"
mkdir -p "$build"
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${PS_BUILD_TYPE:-RelWithDebInfo}" "$@" \
    >"$build/configure.log" 2>&1; then
  cat "$build/configure.log"
  echo "build.sh: cmake configure failed (log: $build/configure.log)" >&2
  exit 1
fi
cmake --build "$build" -j "$jobs"
