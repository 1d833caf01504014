#!/usr/bin/env bash
# The GPU check, run on a lent GPU machine from the bundle scripts/gpu_bundle.sh makes:
#   tar -xJf gpu_bundle.tar.xz && bash gpu_bundle/gpu_check.sh [options]
# It runs the GPU tests (CUDA kernels, the MLP's and the network's cuda variants, NCCL with a
# group of one), GEMM against the device's peak, and every model row of issue 22's table on
# the device: the small MLP, the wide MLP (784-4096-4096-10, batch 256) and the CNN, each
# `ps_worker --standalone` and as jobs (1 or 2 servers, 1 or 4 workers on the device), with
# PyTorch training the same model on the same device in the same run
# (scripts/pytorch_mlp.py; rows whose PyTorch is missing say so and do not fail). It ends
# with one table: examples/s and test accuracy, ours beside PyTorch's.
#
#   bash gpu_check.sh [--device cuda|cpu] [--epochs 1] [--rows "small wide cnn"]
#                     [--run_seconds 150]
#
# --device cpu runs the same rows on the CPU: how the script itself is tested off a GPU
# machine. $PYTHON (default python3) is the interpreter with PyTorch. Jobs listen on 127.0.0.1 with --insecure (a lent machine reaches nothing else).
# A run past --run_seconds is stopped and its row says so. Everything is written under $OUT
# (or ./gpu_out); exits 1 if a test or a run failed.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-$here/gpu_out}"
device=cuda
epochs=1
rows="small wide cnn"
run_seconds=150
while [ $# -gt 0 ]; do
  case "$1" in
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;  # --name=value as --name value
  esac
  case "$1" in
    -h|--help) sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --device|--epochs|--rows|--run_seconds)
      [ $# -ge 2 ] || { echo "gpu_check.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --device) device="$2" ;; --epochs) epochs="$2" ;; --rows) rows="$2" ;;
        --run_seconds) run_seconds="$2" ;;
      esac
      shift 2 ;;
    *) echo "gpu_check.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
case "$device" in cuda|cpu) ;; *) echo "gpu_check.sh: --device=$device: expected cuda or cpu" >&2; exit 2 ;; esac
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: --epochs=$epochs: expected a count >= 1" >&2; exit 2; }
[[ "$run_seconds" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check.sh: --run_seconds=$run_seconds: expected seconds >= 1" >&2; exit 2; }
for r in $rows; do
  case "$r" in small|wide|cnn) ;; *) echo "gpu_check.sh: --rows: unknown row '$r' (expected small, wide, cnn)" >&2; exit 2 ;; esac
done

bin="$here/bin"
data="$here/data"
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
export OPENBLAS_NUM_THREADS=1
rc=0
: >"$out/rows.tsv"

# Tests: their verdict lines go to tests.txt, whole outputs beside it.
if [ "$device" = cuda ]; then
  nvidia-smi -L 2>&1 | tee "$out/gpu.txt"
  for t in cuda_kernels_test mlp_test network_cuda_test conv_kernels_test nccl_group_test; do
    [ -x "$bin/$t" ] || continue
    if "$bin/$t" >"$out/$t.txt" 2>&1; then v=passed; else v=FAILED; rc=1; fi
    echo "$t: $v ($(grep -E '^\[  (PASSED|SKIPPED|FAILED) ' "$out/$t.txt" | tr '\n' ' '))" | tee -a "$out/tests.txt"
  done
  "$bin/ps_kernel_bench" --benchmark_filter='BM_Gemm' --benchmark_min_time=0.2 \
    >"$out/gemm_bench.txt" 2>&1 || rc=1
fi

# Stops `pid` after --run_seconds; returns 124 if it had to.
wait_bounded() {
  local pid=$1 waited=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge $((run_seconds * 10)) ]; then
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; return 124
    fi
    sleep 0.1; waited=$((waited + 1))
  done
  wait "$pid"
}

# A row: its label, the run directory holding summary.json, and how the run ended.
row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$out/rows.tsv"; }

standalone() {  # label name flagfile job_flags
  local run="$out/$2"
  rm -rf "$run"
  "$bin/ps_worker" --standalone --device="$device" --job_flagfile="$here/$3" \
    --job_flags="--data_dir=$data --epochs=$epochs $4" --run_dir="$run" >"$out/$2.log" 2>&1 &
  local status=ok
  wait_bounded $! || { status="failed ($?)"; rc=1; }
  row "$1" "$run" "$status"
}

job() {  # label name flagfile servers workers job_flags [worker_flags]
  local run="$out/$2" servers=$4 workers=$5 pids=() status=ok
  rm -rf "$run"; mkdir -p "$run"
  # shellcheck disable=SC2086  # $6: the job's flags, one word each
  "$bin/ps_coordinator" --flagfile="$here/$3" --data_dir="$data" --epochs="$epochs" \
    --num_servers="$servers" --num_workers="$workers" --insecure --listen='tcp://127.0.0.1:*' \
    --endpoint_file="$run/ep" --run_dir="$run" $6 >"$run/coordinator.out" 2>"$run/coordinator.log" &
  local coord=$!
  for _ in $(seq 100); do [ -s "$run/ep" ] && break; sleep 0.1; done
  if [ -s "$run/ep" ]; then
    local ep; ep="$(cat "$run/ep")"
    for s in $(seq "$servers"); do
      "$bin/ps_server" --coordinator="$ep" --insecure >"$run/server-$s.log" 2>&1 & pids+=($!)
    done
    for w in $(seq "$workers"); do
      # shellcheck disable=SC2086  # $7: the workers' own flags, one word each
      "$bin/ps_worker" --coordinator="$ep" --insecure --device="$device" ${7:-} \
        >"$run/worker-$w.log" 2>&1 &
      pids+=($!)
    done
    wait_bounded "$coord" || { status="failed ($?)"; rc=1; }
  else
    status="failed (no coordinator endpoint)"; rc=1
  fi
  kill "$coord" "${pids[@]}" 2>/dev/null
  wait "$coord" "${pids[@]}" 2>/dev/null
  row "$1" "$run" "$status"
}

python="${PYTHON:-python3}"
have_torch=0
"$python" -c 'import torch' 2>/dev/null && have_torch=1
pytorch() {  # label name pytorch_mlp.py options
  local run="$out/$2"
  rm -rf "$run"
  if [ "$have_torch" = 0 ]; then row "$1" "$run" "skipped (no PyTorch here)"; return; fi
  # shellcheck disable=SC2086  # $3: options, one word each
  "$python" "$here/pytorch_mlp.py" --device="$device" --data_dir="$data" --epochs="$epochs" \
    --run_dir="$run" $3 >"$out/$2.log" 2>&1 &
  local status=ok
  wait_bounded $! || status="failed ($?)"
  row "$1" "$run" "$status"
}

wide="--mlp_layers=784,4096,4096,10"
for r in $rows; do
  echo "== $r" >&2
  case "$r" in
    small)
      pytorch "small MLP: PyTorch (batch 512)" pt_small ""
      standalone "small MLP: ps_worker --standalone" sa_small fashion_mnist_mlp.flags ""
      job "small MLP: job, 1 server + 1 worker" job_small fashion_mnist_mlp.flags 1 1 ""
      job "small MLP: job, 1 + 1, --local_steps=4" job_small_ls4 fashion_mnist_mlp.flags 1 1 \
        "--local_steps=4" ;;
    wide)
      pytorch "wide MLP: PyTorch (batch 256)" pt_wide "--layers=784,4096,4096,10 --batch_size=256"
      standalone "wide MLP: ps_worker --standalone" sa_wide fashion_mnist_mlp.flags \
        "$wide --global_batch_size=256"
      job "wide MLP: job, 2 servers + 1 worker" job_wide1 fashion_mnist_mlp.flags 2 1 \
        "$wide --global_batch_size=256"
      job "wide MLP: job, 2 servers + 4 workers" job_wide4 fashion_mnist_mlp.flags 2 4 \
        "$wide --global_batch_size=1024"
      # The settings the README names for a GPU worker: local steps, 16-bit pushes and pulls.
      job "wide MLP: job, 2 + 1, --local_steps=4, bf16 wire" job_wide1_ls4 \
        fashion_mnist_mlp.flags 2 1 "$wide --global_batch_size=256 --local_steps=4" \
        "--wire_dtype=bf16 --pull_dtype=bf16"
      job "wide MLP: job, 2 + 4, --local_steps=4, bf16 wire" job_wide4_ls4 \
        fashion_mnist_mlp.flags 2 4 "$wide --global_batch_size=1024 --local_steps=4" \
        "--wire_dtype=bf16 --pull_dtype=bf16" ;;
    cnn)
      pytorch "CNN: PyTorch (batch 64)" pt_cnn \
        "--model=cnn --batch_size=64 --base_lr=0.03 --warmup_iters=0 --no_nesterov"
      standalone "CNN: ps_worker --standalone" sa_cnn fashion_mnist_cnn.flags ""
      job "CNN: job, 1 server + 1 worker" job_cnn fashion_mnist_cnn.flags 1 1 "" ;;
  esac
done

# The table: each row's examples/s and accuracy, and its ratio to the PyTorch row above it.
python3 - "$out/rows.tsv" "$device" "$epochs" <<'PY' | tee "$out/table.md"
import json, os, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
print(f"\ndevice {sys.argv[2]}, {sys.argv[3]} epoch(s) each; examples/s of training\n")
print("| run | examples/s | test acc | / PyTorch | ended |")
print("| --- | ---: | ---: | ---: | --- |")
reference = None
for label, run, status in rows:
    summary = {}
    try:
        with open(os.path.join(run, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        pass
    rate = summary.get("examples_per_sec") or 0
    acc = summary.get("test_accuracy")
    if summary.get("status", "ok") != "ok" and status == "ok":
        status = summary.get("status")
    if "PyTorch" in label:
        reference = rate if status == "ok" and rate > 0 else None
        ratio = ""
    else:
        ratio = f"{rate / reference:.2f}x" if reference and rate > 0 else "-"
    print(f"| {label} | {rate:,.0f} | {'-' if acc is None else f'{acc:.4f}'} | {ratio} | {status} |")
PY
[ -f "$out/tests.txt" ] && cat "$out/tests.txt"
[ -f "$out/gemm_bench.txt" ] && grep -E 'BM_Gemm' "$out/gemm_bench.txt" | head -20
exit "$rc"
