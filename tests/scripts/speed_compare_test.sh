#!/usr/bin/env bash
# scripts/speed_compare.sh end to end on one epoch: every run it makes finishes and lands in
# the table, and with PyTorch present (Debian's python3-torch under /usr/bin/python3) the
# PyTorch row and the job/PyTorch ratio are printed, PyTorch on the workers' OpenBLAS kernels. Without PyTorch it runs --no_pytorch
# (the script would install python3-torch; a test does not).
set -uo pipefail
root="${PS_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
tmp="$(mktemp -d /tmp/ps_speed_compare_test.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/out/*.log; do [ -f "$f" ] && { echo "---- $f"; tail -8 "$f"; } >&2; done
  exit 1
}

torch=1
/usr/bin/python3 -c 'import torch' 2>/dev/null || torch=0
opts=(--out "$tmp/out")
[ "$torch" = 1 ] || opts+=(--no_pytorch)
cd "$root" || fail "no source tree at $root"
timeout 200 bash scripts/speed_compare.sh "${opts[@]}" -- --epochs=1 --global_batch_size=128 \
  >"$tmp/table.txt" 2>&1 || { cat "$tmp/table.txt" >&2; fail "speed_compare.sh exited $?"; }
cat "$tmp/table.txt"
expected=(standalone-blas1 standalone-blas2 job job-prefetch)
[ "$torch" = 1 ] && expected+=(pytorch)
for run in "${expected[@]}"; do
  # A row: the run's name, its command seconds and examples/s as numbers, a final accuracy.
  grep -Eq "^$run +[0-9.]+ +[0-9]+ +[-0-9.]+ +0\.[0-9]+" "$tmp/table.txt" ||
    fail "no row for $run in the table"
done
if [ "$torch" = 1 ]; then
  grep -Eq "^the job's whole command / PyTorch's: [0-9.]+x$" "$tmp/table.txt" ||
    fail "no job/PyTorch ratio printed"
  # PyTorch's GEMMs run the OpenBLAS kernels the workers ran (not OpenBLAS's own choice,
  # which on a CPU newer than OpenBLAS is its SSE3 one).
  core="$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["workers"][0]["device"].split("OpenBLAS ")[1])' \
    "$tmp/out/standalone-blas1/summary.json")" || fail "no OpenBLAS core in the standalone summary"
  grep -q "^PyTorch runs OpenBLAS's $core kernels, as the workers do$" "$tmp/table.txt" ||
    fail "PyTorch did not run the workers' OpenBLAS kernels ($core)"
fi
echo PASS
