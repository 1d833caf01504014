#!/usr/bin/env bash
# Trains the default job once per staleness bound, with one worker slowed down, and prints
# a table of wall time, examples/s, time to a target accuracy, final accuracy and time
# blocked by the bound.
#
#   scripts/staleness_sweep.sh [--workers N] [--slow_worker I:F] [--bounds "0 1 2 4 -1"]
#                              [--out DIR] [-- extra job flags]
#
# Defaults: 2 workers, worker 1 three times slower, bounds 0 1 2 4 -1, runs under
# runs/sweep-<time>/S<bound>/. Builds first (scripts/launch_local.sh does). Every option is
# taken as `--name value` or `--name=value`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
workers=2
slow="1:3"
bounds="0 1 2 4 -1"
out="$root/runs/sweep-$(date +%Y%m%d-%H%M%S)"
extra=()
ps_split_options "--workers --slow_worker --bounds --out" "--help" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) ps_usage "$0"; exit 0 ;;
    --workers) workers="$2"; shift 2 ;;
    --slow_worker) slow="$2"; shift 2 ;;
    --bounds) bounds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "staleness_sweep.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
build_flag=()
dirs=()
for s in $bounds; do
  dir="$out/S$s"
  echo "== staleness $s"
  bash "$root/scripts/launch_local.sh" "${build_flag[@]}" --workers "$workers" --slow_worker "$slow" \
    --run_dir "$dir" -- --staleness="$s" "${extra[@]}" | grep -E '^(epoch|done)'
  build_flag=(--no_build)
  dirs+=("$dir")
done
python3 "$root/scripts/run_table.py" "${dirs[@]}"
