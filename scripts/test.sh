#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
#
#   scripts/test.sh [--sanitize=address,undefined] [ctest arguments...]
#
# --sanitize builds into build-sanitize/ with those -fsanitize= checks (CUDA off) and runs
# the same tests there. Tests that need a GPU skip themselves where none is present.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sanitize=""
ctest_args=()
for a in "$@"; do
  case "$a" in
    --sanitize=*) sanitize="${a#--sanitize=}" ;;
    *) ctest_args+=("$a") ;;
  esac
done

bash "$root/scripts/install_deps.sh"
start=$SECONDS
if [ -n "$sanitize" ]; then
  export PS_BUILD_DIR="$root/build-sanitize"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  bash "$root/scripts/build.sh" -DPS_SANITIZE="$sanitize" -DPS_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
else
  export PS_BUILD_DIR="$root/build"
  bash "$root/scripts/build.sh"
fi
echo "test.sh: built in $((SECONDS - start)) s"
export PS_BIN_DIR="$PS_BUILD_DIR/bin"
cd "$PS_BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "${ctest_args[@]}"
