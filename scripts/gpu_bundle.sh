#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run the CUDA tests, the GPU benchmarks and a GPU
# worker, into gpu_bundle/ (git-ignored): stripped binaries built here, the shared
# libraries they use that are neither glibc nor CUDA (the GPU machine has its own CUDA
# toolkit and driver, but not this project's Debian packages), and the first 20,000
# Fashion-MNIST training images (enough to time a worker; the whole set would not fit the
# 64 MiB a device call carries). Makes gpu_bundle.tar.xz (about 22 MB). On the GPU machine:
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
      tests/cuda_kernels_test tests/mlp_test tests/kernels_test
      tests/nccl_group_test bin/ps_group_bench)
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
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda*|libcublas*|libcudart*|libnccl*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
cp /usr/share/datasets/fashion-mnist/t10k-*.gz "$out/data/"
python3 - "$out/data" <<'PY'
import gzip, struct, sys
src, dst, n = "/usr/share/datasets/fashion-mnist/", sys.argv[1] + "/", 20000
with gzip.open(src + "train-images-idx3-ubyte.gz") as f:
    magic, _, rows, cols = struct.unpack(">IIII", f.read(16))
    images = f.read(n * rows * cols)
with gzip.open(dst + "train-images-idx3-ubyte.gz", "wb") as g:
    g.write(struct.pack(">IIII", magic, n, rows, cols) + images)
with gzip.open(src + "train-labels-idx1-ubyte.gz") as f:
    magic, _ = struct.unpack(">II", f.read(8))
    labels = f.read(n)
with gzip.open(dst + "train-labels-idx1-ubyte.gz", "wb") as g:
    g.write(struct.pack(">II", magic, n) + labels)
PY
cp "$root/scripts/gpu_check.sh" "$out/"
cp "$root/configs/fashion_mnist_mlp.flags" "$out/"
tar -C "$root" -cJf "$root/gpu_bundle.tar.xz" gpu_bundle
ls -la "$root/gpu_bundle.tar.xz"
