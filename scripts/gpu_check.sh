#!/usr/bin/env bash
# Runs on a GPU machine from the bundle scripts/gpu_bundle.sh made: the CUDA kernel tests,
# the MLP tests (which add a cuda variant where a GPU is visible), the kernel benchmarks
# (GEMM TFLOP/s per precision, memory-bound kernels against peak bandwidth), and the
# default job for 1 epoch with one GPU worker and with one CPU worker, for examples/s.
# Writes everything under $OUT (or ./gpu_out).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-$here/gpu_out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
export OPENBLAS_NUM_THREADS=1
nvidia-smi -L 2>&1 | tee "$out/gpu.txt"
rc=0
"$here/bin/cuda_kernels_test" 2>&1 | tee "$out/cuda_kernels_test.txt" | tail -3 || rc=1
"$here/bin/mlp_test" 2>&1 | tee "$out/mlp_test.txt" | tail -3 || rc=1
# All-reduce groups: NCCL with a group of one (needs libnccl.so.2 on the machine).
"$here/bin/nccl_group_test" 2>&1 | tee "$out/nccl_group_test.txt" | tail -3 || rc=1
"$here/bin/ps_group_bench" --sizes_mb=4,64 --iters=5 2>&1 | tee "$out/group_bench.txt"
"$here/bin/ps_kernel_bench" --benchmark_min_time=0.2 2>&1 | tee "$out/kernel_bench.txt" | tail -40
for device in cuda cpu; do
  run="$out/job_$device"
  rm -rf "$run"; mkdir -p "$run"
  "$here/bin/ps_coordinator" --flagfile="$here/fashion_mnist_mlp.flags" --data_dir="$here/data" \
    --num_servers=1 --num_workers=1 --epochs=1 --listen='tcp://127.0.0.1:*' \
    --endpoint_file="$run/ep" --run_dir="$run" >"$run/coordinator.out" 2>"$run/coordinator.log" &
  coord=$!
  for _ in $(seq 100); do [ -s "$run/ep" ] && break; sleep 0.1; done
  ep="$(cat "$run/ep")"
  "$here/bin/ps_server" --coordinator="$ep" >"$run/server.log" 2>&1 &
  server=$!
  if "$here/bin/ps_worker" --coordinator="$ep" --device="$device" >"$run/worker.log" 2>&1; then
    timeout 120 tail -f --pid="$coord" /dev/null || kill "$coord" 2>/dev/null
    wait "$coord" || rc=1
  else
    echo "worker on $device failed:"; tail -3 "$run/worker.log"; rc=1
    kill "$coord" 2>/dev/null; wait "$coord" 2>/dev/null
  fi
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
  echo "== $device"; tail -2 "$run/coordinator.out"
done
exit "$rc"
