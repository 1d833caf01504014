#!/usr/bin/env bash
# scripts/gpu_check.sh, the script a lent GPU machine runs from the bundle, run here with
# --device=cpu on the small MLP for one epoch, from a bundle-shaped directory of links (the
# bundle itself takes a minute of xz): the standalone and job rows end ok with examples/s and
# an accuracy, the PyTorch row too where /usr/bin/python3 has torch (with its ratio column
# filled), a bad option is refused with exit 2.
set -uo pipefail
root="${PS_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
bin="${PS_BIN_DIR:-$root/build/bin}"
data=/usr/share/datasets/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "SKIP: no Fashion-MNIST"; exit 77; }
tmp="$(mktemp -d /tmp/ps_gpu_check_test.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/out/*.log "$tmp"/out/*/coordinator.log; do
    [ -f "$f" ] && { echo "---- $f"; tail -5 "$f"; } >&2
  done
  exit 1
}

b="$tmp/bundle"
mkdir -p "$b"
ln -s "$bin" "$b/bin"
ln -s "$data" "$b/data"
for f in scripts/gpu_check.sh scripts/pytorch_mlp.py configs/fashion_mnist_mlp.flags \
  configs/fashion_mnist_cnn.flags; do
  ln -s "$root/$f" "$b/$(basename "$f")"
done

bash "$b/gpu_check.sh" --device=gpu >/dev/null 2>"$tmp/err"
[ $? = 2 ] || fail "--device=gpu was not refused with exit 2"
grep -q "expected cuda or cpu" "$tmp/err" || fail "the refusal does not say what was expected"

torch=1
/usr/bin/python3 -c 'import torch' 2>/dev/null || torch=0
OUT="$tmp/out" PYTHON=/usr/bin/python3 timeout 200 bash "$b/gpu_check.sh" --device cpu \
  --rows=small --epochs 1 --run_seconds 120 >"$tmp/table.txt" 2>&1 ||
  { cat "$tmp/table.txt" >&2; fail "gpu_check.sh exited $?"; }
cat "$tmp/table.txt"
# A row: label | examples/s | accuracy | ratio | ended.
row='[0-9][0-9,]* \| 0\.[0-9]{4} \|'
grep -Eq "^\| small MLP: ps_worker --standalone \| $row .* \| ok \|$" "$tmp/table.txt" ||
  fail "no standalone row"
grep -Eq "^\| small MLP: job, 1 server \+ 1 worker \| $row .* \| ok \|$" "$tmp/table.txt" ||
  fail "no job row"
grep -Eq "^\| small MLP: job, 1 \+ 1, --local_steps=4 \| $row .* \| ok \|$" "$tmp/table.txt" ||
  fail "no local-steps row"
if [ "$torch" = 1 ]; then
  grep -Eq "^\| small MLP: PyTorch \(batch 512\) \| $row  \| ok \|$" "$tmp/table.txt" ||
    fail "no PyTorch row"
  grep -Eq "^\| small MLP: job, 1 server \+ 1 worker \| $row [0-9.]+x \| ok \|$" "$tmp/table.txt" ||
    fail "no job/PyTorch ratio"
else
  grep -q "skipped (no PyTorch here)" "$tmp/table.txt" || fail "the PyTorch row is not marked skipped"
fi
echo "gpu_check_test: ok"
