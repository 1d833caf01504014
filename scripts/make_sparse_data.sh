#!/usr/bin/env bash
# Writes the synthetic sparse data set that configs/sparse_lr.flags trains on:
# LIBSVM files from a known ground-truth weight vector, Zipf-skewed feature popularity as in
# CTR data.
#
#   scripts/make_sparse_data.sh [--features N] [--examples N] [--test_examples N]
#                               [--nnz K] [--seed S] [--out DIR]
#
# Defaults: 1,000,000 features, 400,000 training and 50,000 test examples, 20 features
# each, into data/sparse_lr/ (train.svm, test.svm, truth.txt). Builds first if needed
# (skipped, as by scripts/launch_local.sh, when the build stamp says nothing changed).
# Every option is taken as `--name value` or `--name=value`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
source "$root/scripts/lib/build_stamp.sh"
features=1000000
examples=400000
test_examples=50000
nnz=20
seed=1
out="$root/data/sparse_lr"
ps_split_options "--features --examples --test_examples --nnz --seed --out" "--help" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) ps_usage "$0"; exit 0 ;;
    --features) features="$2"; shift 2 ;;
    --examples) examples="$2"; shift 2 ;;
    --test_examples) test_examples="$2"; shift 2 ;;
    --nnz) nnz="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "make_sparse_data.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
ps_build_dir "$root"
if [ -n "${PS_BIN_DIR:-}" ]; then
  bin="$PS_BIN_DIR"
else
  bin="$PS_BUILD/bin"
  ps_ensure_built "$root" "$PS_BUILD/build.log"
fi
[ -x "$bin/ps_make_sparse_data" ] || { echo "make_sparse_data.sh: $bin/ps_make_sparse_data is missing: build first (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$out"
"$bin/ps_make_sparse_data" --features="$features" --examples="$examples" --nnz="$nnz" \
  --seed="$seed" --out="$out/train.svm" --test_out="$out/test.svm" \
  --test_examples="$test_examples" --truth="$out/truth.txt"
echo "wrote $out/train.svm ($examples examples), $out/test.svm ($test_examples), $out/truth.txt"
