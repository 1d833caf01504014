#!/usr/bin/env bash
# Writes the synthetic sparse data set that configs/sparse_lr.flags trains on:
# LIBSVM files from a known ground-truth weight vector, Zipf-skewed feature popularity as in
# CTR data.
#
#   scripts/make_sparse_data.sh [--features N] [--examples N] [--test_examples N]
#                               [--nnz K] [--seed S] [--out DIR]
#
# Defaults: 1,000,000 features, 400,000 training and 50,000 test examples, 20 features
# each, into data/sparse_lr/ (train.svm, test.svm, truth.txt). Builds first if needed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
features=1000000
examples=400000
test_examples=50000
nnz=20
seed=1
out="$root/data/sparse_lr"
while [ $# -gt 0 ]; do
  case "$1" in
    --features) features="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    --test_examples) test_examples="$2"; shift 2 ;;
    --nnz) nnz="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "make_sparse_data.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
bin="${PS_BIN_DIR:-$root/build/bin}"
if [ ! -x "$bin/ps_make_sparse_data" ]; then
  bash "$root/scripts/install_deps.sh"
  bash "$root/scripts/build.sh" >/dev/null
fi
mkdir -p "$out"
"$bin/ps_make_sparse_data" --features="$features" --examples="$examples" --nnz="$nnz" \
  --seed="$seed" --out="$out/train.svm" --test_out="$out/test.svm" \
  --test_examples="$test_examples" --truth="$out/truth.txt"
echo "wrote $out/train.svm ($examples examples), $out/test.svm ($test_examples), $out/truth.txt"
