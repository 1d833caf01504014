#!/usr/bin/env bash
# What one more worker costs: a tiny model (sparse logistic regression, 10,000 features,
# 20 per example) trained by 1, 4, 16 and 64 worker processes against 2 servers on this
# machine, each worker doing the same work (--per_worker examples, batch 32, SSP bound 2).
#
#   scripts/cost_growth.sh [--workers "1 4 16 64"] [--per_worker 4096] [--out DIR]
#
# Prints one row per job from its summary.json: the coordinator's CPU seconds (total and
# per worker), the requests it answered per second while workers trained (reports,
# leases), clock ticks the servers received per second (every step of every worker ticks
# every server), pushes per second, and each step's pull round trip (workers' p50 and p99,
# holds by the staleness bound included). Expects a build (build/bin or PS_BIN_DIR). Every
# option is taken as `--name value` or `--name=value`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/options.sh
worker_counts="1 4 16 64"
per_worker=4096
out="runs/cost-growth-$(date +%Y%m%d-%H%M%S)"
ps_split_options "--workers --per_worker --out" "--help" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) ps_usage "$0"; exit 0 ;;
    --workers) worker_counts="$2"; shift 2 ;;
    --per_worker) per_worker="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "cost_growth.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bin="${PS_BIN_DIR:-build/bin}"
mkdir -p "$out"
for w in $worker_counts; do
  examples=$((w * per_worker))
  data="$out/data-$w"
  mkdir -p "$data"
  "$bin/ps_make_sparse_data" --features=10000 --examples="$examples" --nnz=20 \
    --out="$data/train.svm" --test_out="$data/test.svm" --test_examples=2000 >/dev/null 2>&1
  PS_BIN_DIR="$bin" scripts/launch_local.sh configs/sparse_lr.flags --no_build --servers 2 \
    --workers "$w" --run_dir "$out/job-$w" -- --train_data="$data/train.svm" \
    --test_data="$data/test.svm" --epochs=1 --batch_size=32 --chunk_examples=512 \
    --staleness=2 --report_every_seconds=1 >"$out/job-$w.log" 2>&1 ||
    { echo "job with $w workers failed: $out/job-$w.log" >&2; exit 1; }
done
python3 - "$out" $worker_counts <<'PY'
import json, sys, statistics
out, counts = sys.argv[1], [int(x) for x in sys.argv[2:]]
print(f"{'workers':>7} {'train_s':>7} {'coord_cpu_s':>11} {'cpu_ms/worker':>13} {'coord_msg/s':>11} "
      f"{'ticks/s':>8} {'ticks/s/worker':>14} {'pushes/s':>9} {'pull_p50_ms':>11} {'pull_p99_ms':>11}")
for w in counts:
    s = json.load(open(f"{out}/job-{w}/summary.json"))
    t = s["train_seconds"]
    steps = sum(x.get("steps", 0) for x in s["workers"])
    servers = len(s["servers"])
    ticks = steps * servers / t if t else 0
    p50 = statistics.median(x.get("pull_wait_ms", {}).get("p50", 0) for x in s["workers"])
    p99 = max(x.get("pull_wait_ms", {}).get("p99", 0) for x in s["workers"])
    cpu = s.get("coordinator_cpu_seconds", 0)
    print(f"{w:>7} {t:>7.1f} {cpu:>11.2f} {1000 * cpu / w:>13.1f} {s.get('coordinator_messages_per_sec', 0):>11.1f} "
          f"{ticks:>8.0f} {ticks / w:>14.0f} {s['pushes_applied'] / t:>9.0f} {p50:>11.2f} {p99:>11.2f}")
PY
