#!/usr/bin/env bash
# The default job against the single-process baseline and PyTorch, as a table: the whole
# command's seconds, examples/s, seconds to a test accuracy (0.88 by default), final
# accuracy, and where each worker's time went.
#
#   scripts/speed_compare.sh [--target 0.88] [--out DIR] [--no_pytorch] [-- extra job flags]
#
# Runs, one after another: `ps_worker --standalone` (OPENBLAS_NUM_THREADS=1 and =2), the
# default job (2 servers, 2 workers), the same job with --prefetch, and the same model and
# schedule in plain PyTorch on one thread (scripts/pytorch_mlp.py; python3-torch is
# installed here unless --no_pytorch). `-- --epochs=N` (and any other job flag) applies to
# every run; the PyTorch run takes its epochs, max_iter and global batch from the config
# and those flags.
# Each run keeps its run directory under DIR (default runs/speed-<time>). Expects a build.
# Every option is taken as `--name value` or `--name=value`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/options.sh
target=0.88
out="runs/speed-$(date +%Y%m%d-%H%M%S)"
extra=()
pytorch=1
ps_split_options "--target --out" "--help --no_pytorch" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) ps_usage "$0"; exit 0 ;;
    --target) target="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --no_pytorch) pytorch=0; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "speed_compare.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bin="${PS_BIN_DIR:-build/bin}"
flagfile=configs/fashion_mnist_mlp.flags
mkdir -p "$out"
job_flags="${extra[*]:-}"
# The whole command's seconds, as a user would time it.
timed() {
  local name="$1"
  shift
  local t0
  t0=$(date +%s.%N)
  "$@" >"$out/$name.log" 2>&1 || echo "speed_compare.sh: $name failed (see $out/$name.log)" >&2
  echo "$name $(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$t0" "$(date +%s.%N)")" >>"$out/commands.txt"
}
: >"$out/commands.txt"
for t in 1 2; do
  timed "standalone-blas$t" env OPENBLAS_NUM_THREADS=$t "$bin/ps_worker" --standalone \
    --job_flagfile="$flagfile" --job_flags="$job_flags" --run_dir="$out/standalone-blas$t"
done
timed job env PS_BIN_DIR="$bin" scripts/launch_local.sh "$flagfile" --no_build \
  --run_dir "$out/job" -- "${extra[@]}"
timed job-prefetch env PS_BIN_DIR="$bin" scripts/launch_local.sh "$flagfile" --no_build \
  --run_dir "$out/job-prefetch" --worker_flags "--prefetch=true" -- "${extra[@]}"
runs="standalone-blas1 standalone-blas2 job job-prefetch"
if [ "$pytorch" = 1 ]; then
  # Debian's python3-torch is for Debian's interpreter, whatever python3 is first on PATH.
  if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null
  fi
  # The last --epochs=, --max_iter= and --global_batch_size= of the config and the extra
  # flags, from flag lines only (a comment may quote one); none: empty (grep finding
  # nothing must not end the script under pipefail).
  last() { { grep -h -o -- "^--$1=[0-9]*" "$flagfile"; printf '%s\n' "${extra[@]}" | grep -o -- "^--$1=[0-9]*"; } | tail -1 | cut -d= -f2 || true; }
  epochs="$(last epochs)"
  max_iter="$(last max_iter)"  # none or 0: the cosine ends with the run, as in the job
  batch="$(last global_batch_size)"  # the job's global batch is PyTorch's batch
  # PyTorch's GEMMs run in the same OpenBLAS: give it the kernels the workers chose (a CPU
  # newer than OpenBLAS gets its SSE3 ones otherwise, kernels/blas_core.h), so that the
  # ratio compares the frameworks, not the kernels.
  core="$(/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["workers"][0]["device"]; print(d.split("OpenBLAS ")[1] if "OpenBLAS " in d else "")' \
    "$out/standalone-blas1/summary.json" 2>/dev/null || true)"
  echo "PyTorch runs OpenBLAS's ${core:-own choice of} kernels, as the workers do"
  timed pytorch env ${core:+OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-$core}"} \
    /usr/bin/python3 scripts/pytorch_mlp.py --epochs "${epochs:-15}" --batch_size "${batch:-512}" \
    --max_iter "${max_iter:-0}" --target "$target" --run_dir "$out/pytorch"
  runs="$runs pytorch"
fi
python3 - "$out" "$target" $runs <<'PY'
import json, sys, os
out, target, runs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
command = dict(l.split() for l in open(os.path.join(out, "commands.txt")))
print(f"{'run':<17} {'command_s':>9} {'ex/s':>8} {'t_to_%.2f' % target:>9} {'final_acc':>9}  step seconds per worker (compute/pull/push/wait)")
for name in runs:
    d = os.path.join(out, name)
    try:
        s = json.load(open(os.path.join(d, "summary.json")))
    except OSError:
        print(f"{name:<17} {float(command[name]):>9.1f}  (no summary.json)")
        continue
    if name == "pytorch":
        tt, steps = s.get("seconds_to_target"), ""
    else:
        t0 = s.get("train_start_time", 0)
        tt = None
        for line in open(os.path.join(d, "metrics.jsonl")):
            m = json.loads(line)
            if m.get("kind") == "eval" and m.get("test_accuracy", 0) >= target:
                tt = m["time"] - t0
                break
        steps = "  ".join("%.1f/%.1f/%.1f/%.1f" % tuple(w.get("step_seconds", {}).get(k, 0) for k in ("compute", "pull", "push", "wait")) for w in s["workers"])
    print(f"{name:<17} {float(command[name]):>9.1f} {s['examples_per_sec']:>8.0f} {('%.1f' % tt) if tt else '-':>9} {s['test_accuracy']:>9.4f}  {steps}")
if "pytorch" in command:
    print(f"the job's whole command / PyTorch's: {float(command['job']) / float(command['pytorch']):.2f}x")
PY
