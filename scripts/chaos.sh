#!/usr/bin/env bash
# Chaos run: the default job while a random worker is killed (kill -9) every few seconds
# and a replacement joins (launch_local.sh --join), then the same job without faults; prints
# both test accuracies, pushes_lost and the failures survived.
#
#   scripts/chaos.sh [--every SECONDS] [--workers N] [--kill_server_once] [--run_dir DIR]
#                    [-- extra job flags]
#
# --every: seconds between kills (default 8); --workers: workers of the job (default 2,
# the default job's). --kill_server_once: also, both runs use --replicas=2 and the first
# kill, --every seconds after training started, is server 0's (kill -9); the workers are
# killed every --every seconds after it as without the flag. Runs take a few minutes each;
# not part of the test suite. Needs a build (scripts/build.sh) and python3. Every option is
# taken as `--name value` or `--name=value`.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
every=8
workers=2
run_dir="$root/runs/chaos-$(date +%Y%m%d-%H%M%S)"
extra=()
kill_server=0
ps_split_options "--every --workers --run_dir" "--kill_server_once --help" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    --every) every="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --run_dir) run_dir="$2"; shift 2 ;;
    --kill_server_once) kill_server=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) ps_usage "$0"; exit 0 ;;
    *) echo "chaos.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[[ "$every" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "chaos.sh: --every must be seconds, got '$every'" >&2; exit 2; }
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "chaos.sh: --workers must be a positive integer, got '$workers'" >&2; exit 2; }
mkdir -p "$run_dir"
[ "$kill_server" = 1 ] && extra+=(--replicas=2)
launch="$root/scripts/launch_local.sh"

# ---- with faults ----
faults="$run_dir/faults"
# A reused --run_dir keeps the last job's endpoint file: the wait below must see this job's.
rm -f "$faults/coordinator.endpoint"
bash "$launch" --no_build --workers "$workers" --run_dir "$faults" -- "${extra[@]}" \
  >"$run_dir/faults.out" 2>&1 &
job=$!
joiners=()
kills=0
while [ ! -s "$faults/coordinator.endpoint" ] && kill -0 "$job" 2>/dev/null; do sleep 0.2; done
endpoint="$(cat "$faults/coordinator.endpoint" 2>/dev/null)"
if [ "$kill_server" = 1 ]; then
  # Once training is under way (a train line in metrics.jsonl), then --every seconds.
  while kill -0 "$job" 2>/dev/null && ! grep -q '"kind":"train"' "$faults/metrics.jsonl" 2>/dev/null; do
    sleep 0.2
  done
  sleep "$every"
  victim="$(pgrep -f "ps_server --coordinator=$endpoint .*--id=0" | head -1)"
  if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then
    echo "chaos: kill -9 server 0 pid $victim at $(date +%T)"
    kills=1
  fi
fi
while kill -0 "$job" 2>/dev/null; do
  sleep "$every"
  kill -0 "$job" 2>/dev/null || break
  mapfile -t live < <(pgrep -f "ps_worker --coordinator=$endpoint" || true)
  # Keep one worker at least; the replacement joins at once.
  if [ "${#live[@]}" -ge 2 ] || { [ "${#live[@]}" -ge 1 ] && [ "$workers" = 1 ]; }; then
    victim="${live[$((RANDOM % ${#live[@]}))]}"
    echo "chaos: kill -9 worker pid $victim at $(date +%T)"
    kill -9 "$victim" 2>/dev/null && kills=$((kills + 1))
  fi
  bash "$launch" --join "$faults" >>"$run_dir/joins.out" 2>&1 &
  joiners+=($!)
done
wait "$job"; faults_rc=$?
for p in "${joiners[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
echo "chaos: the job with faults exited $faults_rc after $kills kills"

# ---- without faults ----
clean="$run_dir/clean"
bash "$launch" --no_build --workers "$workers" --run_dir "$clean" -- "${extra[@]}" \
  >"$run_dir/clean.out" 2>&1
clean_rc=$?
echo "chaos: the job without faults exited $clean_rc"

python3 - "$faults/summary.json" "$clean/summary.json" <<'PY'
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        return {"status": "missing (%s)" % e}
f, c = load(sys.argv[1]), load(sys.argv[2])
print("%-10s %-8s %-9s %-11s %-9s %-8s %s" % ("run", "status", "test_acc", "pushes_lost",
                                               "failures", "joins", "examples_per_epoch"))
for name, s in (("faults", f), ("no faults", c)):
    print("%-10s %-8s %-9.4f %-11s %-9d %-8d %s" % (name, s.get("status"), s.get("test_accuracy", 0),
          s.get("pushes_lost"), len(s.get("failures", [])), len(s.get("joins", [])),
          s.get("examples_per_epoch")))
if "test_accuracy" in f and "test_accuracy" in c:
    print("accuracy difference: %+.2f points" % (100 * (f["test_accuracy"] - c["test_accuracy"])))
det = [x["silent_seconds"] for x in f.get("failures", []) if "silent_seconds" in x]
if det:
    print("silent before declared dead: min %.2f s, max %.2f s (heartbeat_timeout %s s)"
          % (min(det), max(det), f.get("heartbeat_timeout")))
print("failures:")
for x in f.get("failures", []):
    print("  %s %s at %.1fs: %s" % (x.get("kind"), x.get("process"), x.get("time", 0), x.get("recovered")))
    if x.get("kind") == "server_lost":
        print("    silent %.2f s when declared dead; failover (last heartbeat -> backup promoted) %.2f s"
              % (x.get("silent_seconds", 0), x.get("failover_seconds", 0)))
        if "first_pull_served_seconds" in x:
            print("    last heartbeat -> first pull served by the promoted backup %.2f s"
                  % x["first_pull_served_seconds"])
if "test_loss" in f and "test_loss" in c:
    print("test loss: %.9g with faults, %.9g without" % (f["test_loss"], c["test_loss"]))
PY
