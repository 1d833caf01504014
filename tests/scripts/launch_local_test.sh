#!/usr/bin/env bash
# scripts/launch_local.sh's options and start-up checks, on 127.0.0.1:
#   1. --name=value and --name value give the same job (--dry_run prints its command lines);
#      a switch given a value and an option without one are refused with exit 2;
#   2. a one-epoch sparse LR job on a tiny generated data set trains, its options given in
#      both forms, and leaves no process behind;
#   3. a job whose data is missing is refused by the coordinator before any server or worker
#      starts: non-zero within seconds, naming the path and scripts/make_sparse_data.sh.
# Needs the binaries (PS_BIN_DIR, as ctest sets it); every launch is bounded by `timeout`,
# which stops the launcher and so its job.
set -uo pipefail
root="${PS_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
bin="${PS_BIN_DIR:-$root/build/bin}"
export PS_BIN_DIR="$bin"
launch="$root/scripts/launch_local.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
for b in ps_coordinator ps_server ps_worker ps_keygen ps_make_sparse_data; do
  [ -x "$bin/$b" ] || fail "$bin/$b is missing: build first"
done
tmp="$(mktemp -d /tmp/ps_launch_local_test.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
# ps_* processes whose command line names this test's scratch directory.
leftovers() { ps -eo pid=,args= | grep -F "$tmp" | grep -E 'ps_(coordinator|server|worker)' | grep -v grep || true; }

# ---- 1. both option forms, through --dry_run ----
bash "$launch" --dry_run --workers=1 --servers 2 --slow_worker=0:3 --metrics_port 9100 \
  --worker_flags=--prefetch=false --server_flags "--server_threads=2" --transport=tcp \
  --run_dir="$tmp/dry" -- --epochs=1 >"$tmp/dry1" 2>&1 || { cat "$tmp/dry1"; fail "dry run (mixed forms)"; }
bash "$launch" --dry_run --workers 1 --servers=2 --slow_worker 0:3 --metrics_port=9100 \
  --worker_flags --prefetch=false --server_flags=--server_threads=2 --transport tcp \
  --run_dir "$tmp/dry" -- --epochs=1 >"$tmp/dry2" 2>&1 || { cat "$tmp/dry2"; fail "dry run (other forms)"; }
# Only the launcher's pid (in ipc socket names, absent with tcp) could differ: nothing does.
diff "$tmp/dry1" "$tmp/dry2" || fail "the two option forms gave different jobs"
grep -q -- '--num_servers=2 --num_workers=1 ' "$tmp/dry1" || { cat "$tmp/dry1"; fail "no --num_workers=1"; }
grep -q -- '--id=0 .*--slowdown=3 --prefetch=false --metrics_port=9103' "$tmp/dry1" ||
  { cat "$tmp/dry1"; fail "worker 0 is not slowed 3x with --prefetch=false on port 9103"; }
grep -q -- '--server_threads=2 --metrics_port=9102' "$tmp/dry1" || { cat "$tmp/dry1"; fail "server 1's flags"; }
[ "$(grep -c ps_worker "$tmp/dry1")" = 1 ] || fail "expected one worker"
[ ! -e "$tmp/dry" ] || fail "--dry_run made the run directory"

bash "$launch" --dry_run --no_build=1 >"$tmp/bad" 2>&1
[ $? = 2 ] && grep -q -- '--no_build takes no value' "$tmp/bad" || { cat "$tmp/bad"; fail "--no_build=1 accepted"; }
bash "$launch" --dry_run --workers >"$tmp/bad" 2>&1
[ $? = 2 ] && grep -q -- '--workers needs a value' "$tmp/bad" || { cat "$tmp/bad"; fail "--workers without a value"; }
echo "ok: both option forms give the same job"

# ---- 2. a tiny job, end to end ----
mkdir -p "$tmp/gen"
"$bin/ps_make_sparse_data" --features=2000 --examples=4000 --nnz=10 --seed=3 \
  --out="$tmp/gen/train.svm" --test_out="$tmp/gen/test.svm" --test_examples=500 \
  >"$tmp/gen.log" 2>&1 || { cat "$tmp/gen.log"; fail "ps_make_sparse_data"; }
timeout 120 bash "$launch" "$root/configs/sparse_lr.flags" --no_build --workers=1 --servers 1 \
  --transport=tcp --run_dir="$tmp/run" -- --train_data="$tmp/gen/train.svm" \
  --test_data="$tmp/gen/test.svm" --epochs=1 --chunk_examples=1000 >"$tmp/run.out" 2>&1
rc=$?
[ "$rc" = 0 ] || { tail -20 "$tmp/run.out"; tail -20 "$tmp"/run/logs/*.log; fail "the tiny job exited $rc"; }
python3 - "$tmp/run/summary.json" <<'PY' || fail "summary.json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["status"] == "ok", s.get("status")
assert s["examples_per_epoch"] == [4000], s["examples_per_epoch"]
assert len(s["workers"]) == 1 and len(s["servers"]) == 1
PY
grep -q 'checks, build and keys took' "$tmp/run/logs/launcher.log" || fail "no launcher.log"
[ -z "$(leftovers)" ] || fail "processes left behind: $(leftovers)"
echo "ok: a one-epoch job with options in both forms"

# ---- 3. missing data: refused at start, naming the command that makes it ----
start=$SECONDS
timeout 60 bash "$launch" "$root/configs/sparse_lr.flags" --no_build --workers=2 --servers=1 \
  --run_dir "$tmp/missing" -- --train_data="$tmp/none/train.svm" --test_data="$tmp/none/test.svm" \
  >"$tmp/missing.out" 2>&1
rc=$?
took=$((SECONDS - start))
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat "$tmp/missing.out"; fail "a job without its data exited $rc"; }
[ "$took" -le 15 ] || fail "the refusal took $took s"
grep -q "train_data: LIBSVM file $tmp/none/train.svm does not exist" "$tmp/missing.out" ||
  { cat "$tmp/missing.out"; fail "the message does not name the missing path"; }
grep -q "scripts/make_sparse_data.sh --out $tmp/none" "$tmp/missing.out" ||
  { cat "$tmp/missing.out"; fail "the message does not name the command"; }
for f in server-0.log worker-0.log worker-1.log; do
  [ ! -e "$tmp/missing/logs/$f" ] || fail "$f exists: a process started before the refusal"
done
[ ! -e "$tmp/missing/coordinator.endpoint" ] || fail "the coordinator listened"
[ -z "$(leftovers)" ] || fail "processes left behind: $(leftovers)"
echo "ok: missing data refused in $took s (exit $rc)"
