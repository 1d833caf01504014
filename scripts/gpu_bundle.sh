#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run the GPU check (scripts/gpu_check.sh: the CUDA
# tests, GEMM, and every model of issue 22's table beside PyTorch on the same device) into
# gpu_bundle/ (git-ignored): stripped binaries built here, the shared libraries they use that
# are neither glibc nor CUDA (the GPU machine has its own CUDA toolkit and driver, but not
# this project's Debian packages), the whole Fashion-MNIST, the configs and the PyTorch
# reference. Makes gpu_bundle.tar.xz (under the 64 MiB a device call carries). There:
#   tar -xJf gpu_bundle.tar.xz && bash gpu_bundle/gpu_check.sh
# (the device tool: run with carry ["gpu_bundle.tar.xz"]; results land in $OUT).
#
#   scripts/gpu_bundle.sh        # builds first if needed; takes no options
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_bundle.sh: takes no arguments, got '$1'" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PS_BUILD_DIR:-$root/build}"
out="$root/gpu_bundle"
bins=(bin/ps_coordinator bin/ps_server bin/ps_worker bin/ps_kernel_bench bin/ps_bench
      tests/cuda_kernels_test tests/mlp_test tests/kernels_test tests/network_cuda_test
      tests/conv_kernels_test tests/nccl_group_test bin/ps_group_bench)
for b in "${bins[@]}"; do
  [ -x "$build/$b" ] || { bash "$root/scripts/build.sh" >/dev/null; break; }
done
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data"
for b in "${bins[@]}"; do
  strip --strip-debug -o "$out/bin/$(basename "$b")" "$build/$b"
done
# Shared libraries: everything ldd resolves outside glibc and CUDA.
for b in "$out"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda*|libcublas*|libnccl*) ;;  # libcuda* covers libcudart
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$out/data/"
cp "$root/scripts/gpu_check.sh" "$out/"
cp "$root/scripts/pytorch_mlp.py" "$root/configs/fashion_mnist_mlp.flags" \
  "$root/configs/fashion_mnist_cnn.flags" "$out/"
tar -C "$root" -cJf "$root/gpu_bundle.tar.xz" gpu_bundle
size=$(stat -c %s "$root/gpu_bundle.tar.xz")
ls -la "$root/gpu_bundle.tar.xz"
if [ "$size" -gt $((64 * 1024 * 1024)) ]; then
  echo "gpu_bundle.sh: the bundle is $size bytes, over the 64 MiB a device call carries" >&2
  exit 1
fi
