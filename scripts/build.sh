#!/usr/bin/env bash
# Configures and builds the project into build/ (or $PS_BUILD_DIR).
#   scripts/build.sh [extra cmake -D options]
# CUDA is detected (PS_WITH_CUDA=AUTO): nvcc is looked for on PATH and at /usr/local/cuda/bin.
# Every caller (scripts/test.sh, scripts/launch_local.sh, ...) configures through here with
# the same options, so that one build serves them all. After a build that succeeded it
# writes the build stamp that lets launch_local.sh skip the next build check when nothing
# has changed (scripts/lib/build_stamp.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/build_stamp.sh"
ps_build_dir "$root"
build="$PS_BUILD"
jobs="${PS_BUILD_JOBS:-$(nproc)}"
mkdir -p "$build"
# The key of what is about to be built, taken before configuring: an edit made during the
# build leaves a stamp that no longer matches.
key="$(ps_build_key "$root" "$@")"
rm -f "$build/.ps_build_stamp"
if ! cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${PS_BUILD_TYPE:-RelWithDebInfo}" "$@" \
    >"$build/configure.log" 2>&1; then
  cat "$build/configure.log"
  echo "build.sh: cmake configure failed (log: $build/configure.log)" >&2
  exit 1
fi
cmake --build "$build" -j "$jobs"
[ -z "$key" ] || echo "$key" >"$build/.ps_build_stamp"
