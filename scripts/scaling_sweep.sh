#!/usr/bin/env bash
# Trains the default job at several worker counts under BSP, SSP and ASP and prints the
# scaling table: per worker count and consistency, test accuracy (each seed and the mean),
# examples/s, time to a target accuracy, gradient staleness seen and how the runs ended.
#
#   scripts/scaling_sweep.sh [--workers "1 2 4 8 16 32"] [--modes "bsp ssp asp"]
#                            [--seeds "1"] [--servers N] [--target 0.88] [--out DIR]
#                            [--config FILE] [--no_build] [-- extra job flags]
#
# bsp, ssp and asp are --staleness=0, the config's bound (2 in the default job) and -1.
# Runs go one after another (each launcher waits on the processes it started and stops them
# by PID), under runs/scaling-<time>/w<N>-<mode>-s<seed>/, so any row can be read again
# with scripts/run_table.py. A run that fails or diverges stays in the table with its
# status. Every option is taken as `--name value` or `--name=value`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
workers="1 2 4 8 16 32"
modes="bsp ssp asp"
seeds="1"
servers=2
target=0.88
config="$root/configs/fashion_mnist_mlp.flags"
out="$root/runs/scaling-$(date +%Y%m%d-%H%M%S)"
build_flag=()
extra=()
ps_split_options "--workers --modes --seeds --servers --target --out --config" "--help --no_build" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) ps_usage "$0"; exit 0 ;;
    --workers) workers="$2"; shift 2 ;;
    --modes) modes="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --servers) servers="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --no_build) build_flag=(--no_build); shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "scaling_sweep.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for m in $modes; do
  case "$m" in
    bsp|ssp|asp) ;;
    *) echo "scaling_sweep.sh: --modes: unknown mode '$m' (expected bsp, ssp or asp)" >&2; exit 2 ;;
  esac
done
dirs=()
for n in $workers; do
  for m in $modes; do
    mode_flags=()
    case "$m" in
      bsp) mode_flags=(--staleness=0) ;;
      asp) mode_flags=(--staleness=-1) ;;
      ssp) ;;  # the config's bound
    esac
    for s in $seeds; do
      dir="$out/w$n-$m-s$s"
      echo "== $n workers, $m, seed $s"
      # A failed or diverged run is a row of the table, not the end of the sweep.
      bash "$root/scripts/launch_local.sh" "$config" "${build_flag[@]}" --servers "$servers" \
        --workers "$n" --run_dir "$dir" -- "${mode_flags[@]}" --seed="$s" "${extra[@]}" \
        | grep -E '^done|diverged|failed' || true
      build_flag=(--no_build)
      dirs+=("$dir")
    done
  done
done
python3 "$root/scripts/run_table.py" --scaling --target "$target" "${dirs[@]}"
