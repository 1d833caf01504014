#!/usr/bin/env bash
# Writes the synthetic sparse data set that configs/sparse_lr.flags trains on:
# LIBSVM files from a known ground-truth weight vector, Zipf-skewed feature popularity as in
# CTR data.
#
#   scripts/make_sparse_data.sh [--features N] [--examples N] [--test_examples N]
#                               [--nnz K] [--seed S] [--out DIR]
#   scripts/make_sparse_data.sh --ctr [--examples N] [--test_examples N] [--max_vocab N]
#                               [--seed S] [--out DIR]
#
# Defaults: 1,000,000 features, 400,000 training and 50,000 test examples, 20 features
# each, into data/sparse_lr/ (train.svm, test.svm, truth.txt). With --ctr, the Criteo-like
# set that configs/ctr_wide_deep.flags trains on: 13 dense and 26 categorical fields (Zipf
# ids, field vocabularies from 10 to --max_vocab=100000 ids, ~325k ids in all), labels from
# a hidden wide-and-deep model; 1,000,000 training and 20,000 test examples into data/ctr/
# (train.tsv, test.tsv, truth.txt); it prints the best reachable test AUC (that of the true
# probabilities), the first line of truth.txt. Builds first if needed (skipped, as by
# scripts/launch_local.sh, when the build stamp says nothing changed).
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
out=""
ctr=0
max_vocab=100000
ps_split_options "--features --examples --test_examples --nnz --seed --out --max_vocab" \
  "--help --ctr" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) ps_usage "$0"; exit 0 ;;
    --features) features="$2"; shift 2 ;;
    --ctr) ctr=1; shift ;;
    --max_vocab) max_vocab="$2"; shift 2 ;;
    --examples) examples="$2"; examples_set=1; shift 2 ;;
    --test_examples) test_examples="$2"; test_examples_set=1; shift 2 ;;
    --nnz) nnz="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "make_sparse_data.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
if [ "$ctr" = 1 ]; then
  [ -n "${examples_set:-}" ] || examples=1000000
  [ -n "${test_examples_set:-}" ] || test_examples=20000
  [ -n "$out" ] || out="$root/data/ctr"
else
  [ -n "$out" ] || out="$root/data/sparse_lr"
fi
ps_build_dir "$root"
if [ -n "${PS_BIN_DIR:-}" ]; then
  bin="$PS_BIN_DIR"
else
  bin="$PS_BUILD/bin"
  ps_ensure_built "$root" "$PS_BUILD/build.log"
fi
[ -x "$bin/ps_make_sparse_data" ] || { echo "make_sparse_data.sh: $bin/ps_make_sparse_data is missing: build first (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$out"
if [ "$ctr" = 1 ]; then
  "$bin/ps_make_sparse_data" --ctr --examples="$examples" --max_vocab="$max_vocab" \
    --seed="$seed" --out="$out/train.tsv" --test_out="$out/test.tsv" \
    --test_examples="$test_examples" --truth="$out/truth.txt"
  echo "wrote $out/train.tsv ($examples examples), $out/test.tsv ($test_examples), $out/truth.txt"
  exit 0
fi
"$bin/ps_make_sparse_data" --features="$features" --examples="$examples" --nnz="$nnz" \
  --seed="$seed" --out="$out/train.svm" --test_out="$out/test.svm" \
  --test_examples="$test_examples" --truth="$out/truth.txt"
echo "wrote $out/train.svm ($examples examples), $out/test.svm ($test_examples), $out/truth.txt"
