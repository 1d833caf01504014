#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
#
#   scripts/test.sh [--sanitize address,undefined] [ctest arguments...]
#
# Builds through scripts/build.sh into the build directory scripts/launch_local.sh uses
# (PS_BUILD_DIR, default build/), configured the same way, so that either command reuses
# what the other built. --sanitize builds into build-sanitize/ with those -fsanitize= checks
# (CUDA off) and runs the same tests there. Tests that need a GPU skip themselves where none
# is present. Options take `--name value` or `--name=value`; everything else goes to ctest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
source "$root/scripts/lib/build_stamp.sh"
sanitize=""
ctest_args=()
ps_split_options "--sanitize" "" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize="$2"; shift 2 ;;
    -h|--help) ps_usage "$0"; exit 0 ;;
    *) ctest_args+=("$1"); shift ;;
  esac
done

bash "$root/scripts/install_deps.sh"
start=$SECONDS
if [ -n "$sanitize" ]; then
  export PS_BUILD_DIR="$root/build-sanitize"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  export PS_BUILD_TYPE=Debug
  bash "$root/scripts/build.sh" -DPS_SANITIZE="$sanitize" -DPS_WITH_CUDA=OFF
else
  ps_build_dir "$root"
  export PS_BUILD_DIR="$PS_BUILD"
  bash "$root/scripts/build.sh"
fi
echo "test.sh: built in $((SECONDS - start)) s"
export PS_BIN_DIR="$PS_BUILD_DIR/bin"
cd "$PS_BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "${ctest_args[@]}"
