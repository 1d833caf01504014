#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) and runs each for SECONDS, looking for a crash,
# a sanitizer report, a leak, a hang or a broken invariant in the code that reads untrusted
# input: wire headers, the server's request handling, job configs, LIBSVM and IDX files.
#
#   scripts/fuzz.sh SECONDS [TARGET...]      e.g. scripts/fuzz.sh 60, scripts/fuzz.sh 300 fuzz_idx
#
# The whole project is built by clang-14 with ASan and UBSan into build-fuzz/ (ASan must see
# every allocation, so nothing is shared with build/). Each fuzzer starts from a copy of
# tests/fuzz/corpus/TARGET, so the seeds in the repository stay as they are; the copies,
# with what the run added and any failing input, are kept in a scratch directory that the
# output names when something fails.
#
# Prints the executions per target; exits non-zero when any target failed, after printing
# the path of the saved input and the end of the fuzzer's report. Replay a saved input with
#   build-fuzz/fuzz/TARGET PATH
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
all_targets=(fuzz_wire_decode fuzz_server_core fuzz_job_config fuzz_libsvm fuzz_idx)

usage() {
  echo "usage: scripts/fuzz.sh SECONDS [TARGET...]   (targets: ${all_targets[*]})" >&2
  exit 2
}
[ $# -ge 1 ] || usage
seconds="$1"
shift
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || usage
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target $t" >&2; usage; }
done

bash "$root/scripts/install_deps.sh"

build="$root/build-fuzz"
start=$SECONDS
# CC/CXX take effect on the first configure only; a build-fuzz/ made by another compiler
# builds no fuzzers, which the check below reports.
mkdir -p "$build"
CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -DPS_FUZZ=ON -DPS_WITH_CUDA=OFF \
  -DPS_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure-fuzz.log" 2>&1 ||
  { cat "$build/configure-fuzz.log" >&2; exit 1; }
cmake --build "$build" -j2 --target ps_fuzzers
echo "fuzz.sh: built in $((SECONDS - start)) s"
for t in "${targets[@]}"; do
  if [ ! -x "$build/fuzz/$t" ]; then
    echo "fuzz.sh: $build/fuzz/$t was not built: is $build configured with clang?" \
      "(remove it and run again)" >&2
    exit 1
  fi
done

scratch="$(mktemp -d /tmp/ps-fuzz.XXXXXX)"
# Leaks are bugs too; UBSan stops at its first report (the harnesses ask for it as well).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

failed=()
summary=()
for t in "${targets[@]}"; do
  dir="$scratch/$t"
  mkdir -p "$dir/corpus"
  cp -r "$root/tests/fuzz/corpus/$t/." "$dir/corpus/"
  echo "fuzz.sh: $t for $seconds s"
  rc=0
  (cd "$dir" && "$build/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$dir/" corpus >"$dir/log" 2>&1) || rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)"
  per_sec="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)"
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    summary+=("$(printf '%-18s %12s executions  %8s /s  FAILED (exit %d)' "$t" "${execs:-?}" \
      "${per_sec:-?}" "$rc")")
    echo "fuzz.sh: $t FAILED (exit $rc); the end of its report ($dir/log):"
    grep -E '^(==[0-9]+==|SUMMARY:|.*runtime error:| *#[0-9]+ )' "$dir/log" | head -40 || true
    tail -5 "$dir/log"
    for f in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*; do
      if [ -e "$f" ]; then
        echo "fuzz.sh: $t: failing input saved as $f (replay: $build/fuzz/$t $f)"
      fi
    done
  else
    summary+=("$(printf '%-18s %12s executions  %8s /s  ok' "$t" "${execs:-?}" "${per_sec:-?}")")
  fi
done

echo
echo "fuzz.sh: $seconds s per target"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]}; inputs, logs and corpora kept in $scratch"
  exit 1
fi
rm -rf "$scratch"
echo "fuzz.sh: no failures"
