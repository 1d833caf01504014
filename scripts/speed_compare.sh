#!/usr/bin/env bash
# The default job against the single-process baseline, as a table: examples/s, seconds to a
# test accuracy (0.88 by default), final accuracy, and where each worker's time went.
#
#   scripts/speed_compare.sh [--target 0.88] [--out DIR] [-- extra job flags]
#
# Runs, one after another: `ps_worker --standalone` (OPENBLAS_NUM_THREADS=1 and =2), the
# default job (2 servers, 2 workers, prefetch on) and the same job with --prefetch=false.
# Each run keeps its run directory under DIR (default runs/speed-<time>). Expects a build.
# Every option is taken as `--name value` or `--name=value`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/options.sh
target=0.88
out="runs/speed-$(date +%Y%m%d-%H%M%S)"
extra=()
ps_split_options "--target --out" "--help" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) ps_usage "$0"; exit 0 ;;
    --target) target="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "speed_compare.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bin="${PS_BIN_DIR:-build/bin}"
flagfile=configs/fashion_mnist_mlp.flags
mkdir -p "$out"
job_flags="${extra[*]:-}"
for t in 1 2; do
  OPENBLAS_NUM_THREADS=$t "$bin/ps_worker" --standalone --job_flagfile="$flagfile" \
    --job_flags="$job_flags" --run_dir="$out/standalone-blas$t" >"$out/standalone-blas$t.log" 2>&1
done
PS_BIN_DIR="$bin" scripts/launch_local.sh "$flagfile" --no_build --run_dir "$out/job-prefetch" \
  -- "${extra[@]}" >"$out/job-prefetch.log" 2>&1
PS_BIN_DIR="$bin" scripts/launch_local.sh "$flagfile" --no_build --run_dir "$out/job-noprefetch" \
  --worker_flags "--prefetch=false" -- "${extra[@]}" >"$out/job-noprefetch.log" 2>&1
python3 - "$out" "$target" <<'PY'
import json, sys, os
out, target = sys.argv[1], float(sys.argv[2])
print(f"{'run':<18} {'ex/s':>8} {'t_to_%.2f' % target:>9} {'final_acc':>9} {'wall_s':>7}  step seconds per worker (compute/pull/push/wait)")
for name in ["standalone-blas1", "standalone-blas2", "job-prefetch", "job-noprefetch"]:
    d = os.path.join(out, name)
    s = json.load(open(os.path.join(d, "summary.json")))
    t0 = s.get("train_start_time", 0)
    tt = None
    for line in open(os.path.join(d, "metrics.jsonl")):
        m = json.loads(line)
        if m.get("kind") == "eval" and m.get("test_accuracy", 0) >= target:
            tt = m["time"] - t0
            break
    steps = "  ".join("%.1f/%.1f/%.1f/%.1f" % tuple(w.get("step_seconds", {}).get(k, 0) for k in ("compute", "pull", "push", "wait")) for w in s["workers"])
    print(f"{name:<18} {s['examples_per_sec']:>8.0f} {('%.1f' % tt) if tt else '-':>9} {s['test_accuracy']:>9.4f} {s['wall_seconds']:>7.1f}  {steps}")
PY
