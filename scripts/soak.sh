#!/usr/bin/env bash
# Soak run: jobs back to back for MINUTES on loopback while a seeded schedule kills
# workers, servers and the coordinator, then the same job once without faults; prints what
# was killed, pushes_lost, rollbacks, recovery times (p50/p99) and each job's test accuracy
# against the unfaulted one.
#
#   scripts/soak.sh MINUTES [--seed N] [--every SECONDS] [--workers N] [--servers N]
#                   [--run_dir DIR] [-- extra job flags]
#
# Every job is the default config (configs/fashion_mnist_mlp.flags) with --replicas=2 and
# --heartbeat_timeout=3, started by scripts/launch_local.sh, which restarts a killed
# coordinator (with --resume) and killed servers (they take their shards back from their
# backups: re-replication). Every --every seconds (default 8, +-50%, seeded) one process
# goes: the coordinator (kill -9, 15%), a server (35%: kill -9, or SIGTERM, a preemption
# notice, 3 in 10) or a worker (kill -9, or SIGTERM 4 in 10; a replacement joins at once
# through launch_local.sh --join). A server or the coordinator is killed only when every
# shard has two copies again (the coordinator's failures say so), so that no shard ever has
# more than one copy down; otherwise a worker goes instead. Nothing is killed in a job's
# last epoch (its final evaluation). Jobs start until MINUTES have passed; the last one
# finishes. The schedule's choices come from --seed (default 1); the times at which
# processes die and come back depend on the machine.
#
# Not part of the test suite (it runs for as long as asked). Needs a build
# (scripts/build.sh) and python3. Output: RUN_DIR/kills.tsv, RUN_DIR/job-*/ (each job's run
# directory), RUN_DIR/clean/ (the job without faults) and the report on stdout. Every option
# is taken as `--name value` or `--name=value`.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
seed=1
every=8
workers=2
servers=2
run_dir="$root/runs/soak-$(date +%Y%m%d-%H%M%S)"
extra=()
ps_split_options "--seed --every --workers --servers --run_dir" "--help" "$@" || exit 2
set -- "${PS_ARGS[@]}"
minutes=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed="$2"; shift 2 ;;
    --every) every="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --servers) servers="$2"; shift 2 ;;
    --run_dir) run_dir="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) ps_usage "$0"; exit 0 ;;
    -*) echo "soak.sh: unknown option '$1'" >&2; exit 2 ;;
    *) [ -z "$minutes" ] || { echo "soak.sh: one MINUTES only, got '$minutes' and '$1'" >&2; exit 2; }
       minutes="$1"; shift ;;
  esac
done
[[ "$minutes" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "soak.sh: MINUTES must be a number, got '${minutes}' (usage: scripts/soak.sh MINUTES)" >&2; exit 2; }
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "soak.sh: --seed must be a non-negative integer, got '$seed'" >&2; exit 2; }
[[ "$every" =~ ^[0-9]+$ ]] && [ "$every" -ge 2 ] || { echo "soak.sh: --every must be whole seconds >= 2, got '$every'" >&2; exit 2; }
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "soak.sh: --workers must be a positive integer, got '$workers'" >&2; exit 2; }
[[ "$servers" =~ ^[2-9][0-9]*$|^1[0-9]+$ ]] || { echo "soak.sh: --servers must be >= 2 (--replicas=2), got '$servers'" >&2; exit 2; }
bin="${PS_BIN_DIR:-$root/build/bin}"
[ -x "$bin/ps_status" ] || { echo "soak.sh: no build in $bin (run scripts/build.sh)" >&2; exit 2; }
mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"
launch="$root/scripts/launch_local.sh"
job_flags=(--replicas=2 --heartbeat_timeout=3 "${extra[@]}")
kills="$run_dir/kills.tsv"
printf 'unix_time\tjob\tkind\tsignal\tpid\tnote\n' >"$kills"
RANDOM="$seed"

# The status of the job in run directory $1 as JSON ("" when its coordinator does not
# answer: e.g. while it restarts).
status_json() {
  "$bin/ps_status" --coordinator="$(cat "$1/coordinator.endpoint")" --keys_dir="$1/keys" \
    --json --timeout_ms=2000 2>/dev/null
}
# Whether the job in its status (stdin) may lose a server or the coordinator now: every
# server lost so far has its two copies back, and it is not in its last epoch.
may_kill_server() {
  python3 -c '
import json, sys
try:
    s = json.load(sys.stdin)
except Exception:
    sys.exit(1)
if s.get("phase") != "training" or s.get("epoch", 0) >= s.get("epochs", 1):
    sys.exit(1)
for f in s.get("failures", []):
    if f.get("kind") in ("server_lost", "server_left") and "rereplicated_unix_time" not in f:
        sys.exit(1)
'
}
in_last_epoch() {
  python3 -c '
import json, sys
try:
    s = json.load(sys.stdin)
except Exception:
    sys.exit(1)
sys.exit(0 if s.get("epoch", 0) >= s.get("epochs", 1) else 1)
'
}
log_kill() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$EPOCHREALTIME" "$1" "$2" "$3" "$4" "$5" >>"$kills"; }

# One job with faults in $1; returns when it ended.
faulted_job() {
  local dir="$1" job endpoint joiners=() st r kind sig victim live
  rm -f "$dir/coordinator.endpoint"
  bash "$launch" --no_build --workers "$workers" --servers "$servers" --run_dir "$dir" -- \
    "${job_flags[@]}" >"$dir.out" 2>&1 &
  job=$!
  while [ ! -s "$dir/coordinator.endpoint" ] && kill -0 "$job" 2>/dev/null; do sleep 0.2; done
  endpoint="$(cat "$dir/coordinator.endpoint" 2>/dev/null)"
  while kill -0 "$job" 2>/dev/null && ! grep -q '"kind":"train"' "$dir/metrics.jsonl" 2>/dev/null; do
    sleep 0.2
  done
  while kill -0 "$job" 2>/dev/null; do
    sleep $((every / 2 + RANDOM % (every + 1)))
    kill -0 "$job" 2>/dev/null || break
    st="$(status_json "$dir")"
    [ -n "$st" ] && printf '%s' "$st" | in_last_epoch && continue
    r=$((RANDOM % 100)); kind=worker
    if [ "$r" -lt 50 ]; then
      if [ -n "$st" ] && printf '%s' "$st" | may_kill_server; then
        if [ "$r" -lt 15 ]; then kind=coordinator; else kind=server; fi
      else
        log_kill "$(basename "$dir")" skip - - "a server or the coordinator was due, but a shard has one copy (or no status)"
      fi
    fi
    case "$kind" in
      coordinator)
        victim="$(pgrep -f "ps_coordinator .*--run_dir=$dir( |\$)" | head -1)"
        [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null && log_kill "$(basename "$dir")" coordinator KILL "$victim" "" ;;
      server)
        mapfile -t live < <(pgrep -f "ps_server --coordinator=$endpoint " || true)
        [ "${#live[@]}" -ge "$servers" ] || continue
        victim="${live[$((RANDOM % ${#live[@]}))]}"
        sig=KILL; [ $((RANDOM % 10)) -lt 3 ] && sig=TERM
        kill -s "$sig" "$victim" 2>/dev/null && log_kill "$(basename "$dir")" server "$sig" "$victim" "" ;;
      worker)
        mapfile -t live < <(pgrep -f "ps_worker --coordinator=$endpoint" || true)
        sig=KILL; [ $((RANDOM % 10)) -lt 4 ] && sig=TERM
        if [ "${#live[@]}" -ge 2 ] || { [ "${#live[@]}" -ge 1 ] && [ "$workers" = 1 ]; }; then
          victim="${live[$((RANDOM % ${#live[@]}))]}"
          kill -s "$sig" "$victim" 2>/dev/null && log_kill "$(basename "$dir")" worker "$sig" "$victim" ""
        fi
        bash "$launch" --join "$dir" >>"$run_dir/joins.out" 2>&1 &
        joiners+=($!) ;;
    esac
  done
  wait "$job"
  local rc=$?
  for p in "${joiners[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  echo "soak: $(basename "$dir") exited $rc at $(date +%T)"
}

start_unix="$(date +%s)"
end_unix="$(python3 -c "print(int($start_unix + 60 * $minutes))")"
n=0
while [ "$(date +%s)" -lt "$end_unix" ]; do
  n=$((n + 1))
  echo "soak: job $n (faults) at $(date +%T); $(( (end_unix - $(date +%s)) / 60 )) min left"
  faulted_job "$run_dir/job-$n"
done
echo "soak: the job without faults at $(date +%T)"
bash "$launch" --no_build --workers "$workers" --servers "$servers" --run_dir "$run_dir/clean" -- \
  "${job_flags[@]}" >"$run_dir/clean.out" 2>&1
echo "soak: the job without faults exited $?"
python3 "$root/scripts/soak_report.py" "$run_dir" "$((($(date +%s) - start_unix)))"
