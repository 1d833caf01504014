#!/usr/bin/env bash
# Starts a whole job on this machine: 1 coordinator, N servers, M workers on 127.0.0.1.
#
#   scripts/launch_local.sh [FLAGFILE] [--servers N] [--workers N] [--run_dir DIR]
#                           [--device DEV] [--slow_worker I:F] [--metrics_port P]
#                           [--worker_flags "FLAGS"] [--server_flags "FLAGS"]
#                           [--transport tcp|ipc] [--no_build]
#                           [--keys DIR | --insecure] [--restart_servers | --no_restart_servers]
#                           [--dry_run] [-- extra job flags]
#   scripts/launch_local.sh --join RUN_DIR [--device DEV] [-- extra ps_worker flags]
#
# Every option is taken as `--name value` or `--name=value`.
# FLAGFILE defaults to configs/fashion_mnist_mlp.flags. Extra job flags after `--` go to
# the coordinator, which hands them to every process (e.g. -- --epochs=1 --base_lr=0.05).
# --slow_worker I:F makes worker I (0-based) F times slower, to watch a straggler.
# --metrics_port P serves Prometheus metrics on 127.0.0.1: the coordinator on port P,
# server i on P+1+i, worker i on P+1+SERVERS+i (default 0: off).
# --worker_flags passes ps_worker flags to every worker (e.g. "--prefetch=false").
# --server_flags passes ps_server flags to every server, restarted ones too (e.g.
# "--server_threads=4"; by default a server takes a quarter of the cores, 1 to 8).
# --transport: how workers reach the servers on this machine: ipc (Unix sockets, about
# twice loopback TCP's goodput, the default) or tcp (127.0.0.1, as remote peers would).
# Traffic is authenticated and encrypted (CurveZMQ): keys are made in RUN_DIR/keys unless
# --keys DIR names existing ones (ps_keygen / scripts/gen_keys.sh); --insecure turns
# security off (plain ZeroMQ on loopback, with a warning).
# Installs missing packages and builds first unless --no_build; both checks are skipped
# when their stamps in the build directory say that nothing they look at has changed
# (scripts/lib/build_stamp.sh), so a launch after scripts/test.sh or another launch starts
# the coordinator within a fraction of a second. The coordinator refuses a job whose data is
# missing before anything registers, naming the path and the command that makes it.
# --dry_run prints the commands the job would run (after the same checks of the options,
# without building, making keys or starting anything) and exits 0.
# Progress goes to the console; every process's log, metrics.jsonl and summary.json go to
# the run directory, and logs/launcher.log says what was started and how long the checks
# before it took.
# Returns the job's exit status; stops every process it started when the coordinator or a
# server fails, on Ctrl-C and on exit. A worker that dies does not stop the job: the
# coordinator notices (heartbeats), hands its data to the others and goes on. With
# --replicas=2 (in the flagfile or after --) a server that dies does not stop it either:
# the coordinator promotes its backup.
# A coordinator killed by a signal it does not handle (kill -9, a crash) is started again at
# once at the same endpoint with --resume (at most 100 times): it resumes the job from its
# journal (RUN_DIR/coordinator.db) and the servers and workers re-attach. One that exits on
# its own (the job ended, or failed) is not.
# --restart_servers: a server that dies (or exits after handing its shards over on SIGTERM)
# is started again at once with the same flags (a fresh endpoint). With --replicas=2 (at
# most 100 times per server) the new one takes its id back once the old one is declared
# dead, and the backup that served its shards hands them back to it: every shard has two
# copies again (re-replication; nothing is lost). With --replicas=1 (at most 3 times) it
# restores its shards from the latest recorded checkpoint (what was trained on them since
# is lost: see README, "Server failover"). On by default with --replicas=2, and with
# --replicas=1 and a --checkpoint_dir; --no_restart_servers turns it off (a dead server
# then stops a job with --replicas=1).
# --join RUN_DIR adds one worker to the job running in RUN_DIR (it reads the coordinator's
# endpoint there) and returns that worker's exit status; its log is
# RUN_DIR/logs/worker-join-<time>.log.
set -uo pipefail
launch_start="$EPOCHREALTIME"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
source "$root/scripts/lib/build_stamp.sh"

flagfile="$root/configs/fashion_mnist_mlp.flags"
servers=2
workers=2
run_dir=""
device="cpu"
slow_worker=""
metrics_port=0
worker_flags=""
server_flags=""
transport=ipc
build=1
dry_run=0
join_dir=""
keys=""
insecure=0
restart_servers=auto
extra=()
usage() { ps_usage "$0"; }
ps_split_options "--servers --workers --run_dir --device --slow_worker --metrics_port \
  --worker_flags --server_flags --transport --join --keys" \
  "--no_build --insecure --restart_servers --no_restart_servers --dry_run --help" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    --servers) servers="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --run_dir) run_dir="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --slow_worker) slow_worker="$2"; shift 2 ;;
    --metrics_port) metrics_port="$2"; shift 2 ;;
    --worker_flags) worker_flags="$2"; shift 2 ;;
    --server_flags) server_flags="$2"; shift 2 ;;
    --transport) transport="$2"; shift 2 ;;
    --no_build) build=0; shift ;;
    --dry_run) dry_run=1; shift ;;
    --join) join_dir="$2"; shift 2 ;;
    --keys) keys="$2"; shift 2 ;;
    --insecure) insecure=1; shift ;;
    --restart_servers) restart_servers=1; shift ;;
    --no_restart_servers) restart_servers=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "launch_local.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) flagfile="$1"; shift ;;
  esac
done
for v in servers workers; do
  if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
    echo "launch_local.sh: --$v must be a positive integer, got '${!v}'" >&2; exit 2
  fi
done
if ! [[ "$metrics_port" =~ ^[0-9]+$ ]] || [ "$metrics_port" -gt 65535 ]; then
  echo "launch_local.sh: --metrics_port must be 0 (off) or a port, got '$metrics_port'" >&2; exit 2
fi
slow_index=-1
slow_factor=1
if [ -n "$slow_worker" ]; then
  if ! [[ "$slow_worker" =~ ^([0-9]+):([0-9]+(\.[0-9]+)?)$ ]]; then
    echo "launch_local.sh: --slow_worker must be I:F (worker index, slowdown factor), got '$slow_worker'" >&2; exit 2
  fi
  slow_index="${BASH_REMATCH[1]}"
  slow_factor="${BASH_REMATCH[2]}"
  if [ "$slow_index" -ge "$workers" ]; then
    echo "launch_local.sh: --slow_worker $slow_worker names worker $slow_index, but there are $workers (0-based)" >&2; exit 2
  fi
fi
ps_build_dir "$root"
bin="${PS_BIN_DIR:-$PS_BUILD/bin}"
if [ -n "$join_dir" ]; then
  [ -x "$bin/ps_worker" ] || { echo "launch_local.sh: $bin/ps_worker is missing: build first" >&2; exit 1; }
  [ -s "$join_dir/coordinator.endpoint" ] || {
    echo "launch_local.sh: no running job in '$join_dir' (no coordinator.endpoint)" >&2; exit 2; }
  endpoint="$(cat "$join_dir/coordinator.endpoint")"
  mkdir -p "$join_dir/logs"
  log="$join_dir/logs/worker-join-$(date +%Y%m%d-%H%M%S)-$$.log"
  # The job's keys: --keys DIR, else the ones launch_local.sh made in the run directory.
  if [ "$insecure" = 1 ]; then
    join_security=(--insecure)
  else
    [ -n "$keys" ] || keys="$join_dir/keys"
    [ -f "$keys/worker.secret" ] || {
      echo "launch_local.sh: no worker key in '$keys' (give --keys DIR, or --insecure for an insecure job)" >&2; exit 2; }
    join_security=(--keys_dir="$(cd "$keys" && pwd)")
  fi
  echo "joining the job at $endpoint (log: $log)"
  export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
  exec "$bin/ps_worker" --coordinator="$endpoint" --device="$device" "${join_security[@]}" "${extra[@]}" >"$log" 2>&1
fi
[ -f "$flagfile" ] || { echo "launch_local.sh: flagfile '$flagfile' not found" >&2; exit 2; }
flagfile="$(cd "$(dirname "$flagfile")" && pwd)/$(basename "$flagfile")"
case "$transport" in
  tcp|ipc) ;;
  *) echo "launch_local.sh: --transport must be tcp or ipc, got '$transport'" >&2; exit 2 ;;
esac
if [ "$insecure" = 1 ] && [ -n "$keys" ]; then
  echo "launch_local.sh: --keys and --insecure contradict each other" >&2; exit 2
fi
read -r -a server_flag_words <<<"$server_flags"
read -r -a worker_flag_words <<<"$worker_flags"

if [ "$build" = 1 ] && [ "$dry_run" = 0 ]; then
  ps_ensure_built "$root" "$PS_BUILD/build.log" || exit 1
fi
if [ "$dry_run" = 0 ]; then
  for b in ps_coordinator ps_server ps_worker ps_keygen; do
    [ -x "$bin/$b" ] || { echo "launch_local.sh: $bin/$b is missing: build first (scripts/build.sh)" >&2; exit 1; }
  done
fi

[ -n "$run_dir" ] || run_dir="$root/runs/$(date +%Y%m%d-%H%M%S)"
if [ "$dry_run" = 0 ]; then
  mkdir -p "$run_dir/logs"
  run_dir="$(cd "$run_dir" && pwd)"
  rm -f "$run_dir/coordinator.endpoint"
fi

if [ "$insecure" = 1 ]; then
  echo "launch_local.sh: WARNING: --insecure: no authentication, no encryption" >&2
  security=(--insecure)
elif [ "$dry_run" = 1 ]; then
  security=(--keys_dir="${keys:-$run_dir/keys}")
else
  if [ -z "$keys" ]; then
    keys="$run_dir/keys"
    "$bin/ps_keygen" --keys_dir="$keys" >/dev/null || { echo "launch_local.sh: ps_keygen failed" >&2; exit 1; }
  fi
  [ -f "$keys/server.secret" ] || { echo "launch_local.sh: $keys/server.secret not found (make keys with scripts/gen_keys.sh DIR)" >&2; exit 2; }
  keys="$(cd "$keys" && pwd)"
  security=(--keys_dir="$keys")
fi

# The command lines. Server $1 with $2 restarts: a restarted server listens on a fresh
# endpoint, so that the workers' redirect to it reconnects and resends. Unix socket paths
# are limited to 107 bytes: /tmp, not the run directory.
coordinator_cmd=("$bin/ps_coordinator" --flagfile="$flagfile" --num_servers="$servers"
  --num_workers="$workers" --listen='tcp://127.0.0.1:*'
  --endpoint_file="$run_dir/coordinator.endpoint" --run_dir="$run_dir"
  --metrics_port="$metrics_port" "${security[@]}" "${extra[@]}")
server_cmd() {
  local i="$1" n="$2" listen='tcp://127.0.0.1:*' restart=""
  [ "$n" = 0 ] || restart="-r$n"
  [ "$transport" = ipc ] && listen="ipc:///tmp/ps-$$-server-$i$restart.sock"
  cmd=("$bin/ps_server" --coordinator="$endpoint" --listen="$listen" --id="$i" "${security[@]}"
    "${server_flag_words[@]}" --metrics_port=$((metrics_port ? metrics_port + 1 + i : 0)))
}
worker_cmd() {
  local i="$1" slowdown=1
  [ "$i" = "$slow_index" ] && slowdown="$slow_factor"
  cmd=("$bin/ps_worker" --coordinator="$endpoint" --id="$i" --device="$device"
    --slowdown="$slowdown" "${worker_flag_words[@]}"
    --metrics_port=$((metrics_port ? metrics_port + 1 + servers + i : 0)) "${security[@]}")
}

if [ "$dry_run" = 1 ]; then
  endpoint=COORDINATOR_ENDPOINT
  print_cmd() { printf '%q' "$1"; shift; printf ' %q' "$@"; echo; }
  echo "# run directory: $run_dir (from $root)"
  print_cmd "${coordinator_cmd[@]}"
  for ((i = 0; i < servers; i++)); do server_cmd "$i" 0; print_cmd "${cmd[@]}"; done
  for ((i = 0; i < workers; i++)); do worker_cmd "$i"; print_cmd "${cmd[@]}"; done
  exit 0
fi

# Every worker runs one BLAS thread unless told otherwise: several processes each running
# a multi-threaded BLAS on few cores fight each other.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

pids=()
names=()
stop_all() {
  local pid
  [ -n "${console:-}" ] && kill "$console" 2>/dev/null
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  local deadline=$((SECONDS + 5))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  pids=()
  rm -f /tmp/ps-$$-server-*.sock
}
trap 'echo "launch_local.sh: interrupted, stopping the job" >&2; stop_all; exit 130' INT TERM
trap 'stop_all' EXIT

launcher_log="$run_dir/logs/launcher.log"
# Sets ELAPSED to the seconds since this script started, to the millisecond (no subshell:
# forks cost tens of milliseconds each on a loaded machine).
elapsed() {
  local us=$((${EPOCHREALTIME//[.,]/} - ${launch_start//[.,]/}))
  printf -v ELAPSED '%d.%03d' $((us / 1000000)) $((us / 1000 % 1000))
}
# start NAME LOG COMMAND...: starts COMMAND in the background, stdout and stderr appended to
# LOG (the coordinator's stdout is the console's; its stderr goes to coordinator.log).
start() {
  local name="$1" log="$2"
  shift 2
  elapsed
  { printf '%s s: %s:' "$ELAPSED" "$name"; printf ' %q' "$@"; echo; } >>"$launcher_log"
  if [ "$name" = coordinator ]; then
    "$@" >>"$run_dir/logs/coordinator.out" 2>>"$log" &
  else
    "$@" >>"$log" 2>&1 &
  fi
  pids+=($!); names+=("$name")
}

# Flagfiles may name other flagfiles relative to the repository root (configs/...).
cd "$root" || exit 1
echo "run directory: $run_dir"
elapsed
echo "launch_local.sh: checks, build and keys took $ELAPSED s" >"$launcher_log"
: >"$run_dir/logs/coordinator.out"  # exists before tail looks for it
start coordinator "$run_dir/logs/coordinator.log" "${coordinator_cmd[@]}"
coord="${pids[0]}"
# The console shows the coordinator's progress; tail ends once the coordinator has.
# -s: how often tail checks that the coordinator lives (1 s by default: a second lost at the end)
tail -n +1 -s 0.05 -f --pid="$coord" "$run_dir/logs/coordinator.out" &
console=$!

# The coordinator checks the config and the job's data before it listens: a refusal ends
# the launch here, before any server or worker starts.
deadline=$((SECONDS + 30))
while [ ! -s "$run_dir/coordinator.endpoint" ]; do
  if ! kill -0 "$coord" 2>/dev/null; then
    wait "$coord"; rc=$?
    echo "launch_local.sh: the coordinator exited ($rc) before listening:" >&2
    tail -5 "$run_dir/logs/coordinator.log" >&2
    exit "$rc"
  fi
  [ $SECONDS -lt $deadline ] || { echo "launch_local.sh: the coordinator did not start within 30 s" >&2; exit 1; }
  sleep 0.05
done
endpoint="$(cat "$run_dir/coordinator.endpoint")"

start_server() {
  server_cmd "$1" "$2"
  start "server-$1" "$run_dir/logs/server-$1.log" "${cmd[@]}"
}
for ((i = 0; i < servers; i++)); do
  : >"$run_dir/logs/server-$i.log"
  start_server "$i" 0
done
declare -A restarts=()
for ((i = 0; i < workers; i++)); do
  : >"$run_dir/logs/worker-$i.log"
  worker_cmd "$i"
  start "worker-$i" "$run_dir/logs/worker-$i.log" "${cmd[@]}"
done

# With --replicas=2 a dead server's backup takes over (the last setting wins).
replicated=0
for f in $(grep -hoE -- '--replicas=[0-9]+' "$flagfile" 2>/dev/null) "${extra[@]}"; do
  case "$f" in --replicas=2) replicated=1 ;; --replicas=*) replicated=0 ;; esac
done
# --restart_servers by default with --replicas=1 and a checkpoint directory (the last
# setting wins; an empty one turns checkpoints off).
if [ "$restart_servers" = auto ]; then
  restart_servers=0
  for f in $(grep -hoE -- '--checkpoint_dir=[^ ]*' "$flagfile" 2>/dev/null) "${extra[@]}"; do
    case "$f" in --checkpoint_dir=) restart_servers=0 ;; --checkpoint_dir=*) restart_servers=1 ;; esac
  done
  [ "$replicated" = 1 ] && restart_servers=1
fi
max_server_restarts=3
[ "$replicated" = 1 ] && max_server_restarts=100

# Wait for the coordinator to finish; stop early if any other process fails.
rc=0
coord_restarts=0
max_coord_restarts=100
while true; do
  finished=""
  wait -n -p finished "${pids[@]}"
  status=$?
  if [ -z "$finished" ]; then
    # Nothing left to wait on (the coordinator was already reaped).
    break
  fi
  for idx in "${!pids[@]}"; do
    [ "${pids[$idx]}" = "$finished" ] && break
  done
  name="${names[$idx]}"
  unset 'pids[idx]' 'names[idx]'
  pids=("${pids[@]}"); names=("${names[@]}")
  if [ "$finished" = "$coord" ] && [ "$status" -gt 128 ] &&
     [ "$coord_restarts" -lt "$max_coord_restarts" ]; then
    # Killed by a signal it does not handle (-9, a crash): the job goes on under a new
    # coordinator at the same endpoint, resumed from its journal (run_dir/coordinator.db);
    # the servers and workers wait for it (--coordinator_restart_timeout).
    coord_restarts=$((coord_restarts + 1))
    echo "launch_local.sh: the coordinator exited with status $status; restarting it (restart $coord_restarts of at most $max_coord_restarts): it resumes the job from its journal" >&2
    start coordinator "$run_dir/logs/coordinator.log" "${coordinator_cmd[@]}" \
      --listen="$endpoint" --resume
    coord="${pids[-1]}"
    tail -n 0 -s 0.05 -f --pid="$coord" "$run_dir/logs/coordinator.out" &
    console=$!
    continue
  fi
  if [ "$finished" = "$coord" ]; then
    rc=$status
    break
  fi
  if [ "$status" -ne 0 ] && [[ "$name" == worker-* ]]; then
    # The coordinator declares it dead and gives its data to the others.
    echo "launch_local.sh: $name exited with status $status; the job goes on without it" >&2
    continue
  fi
  if [ "$status" -ne 0 ] && [[ "$name" == server-* ]] && [ "$restart_servers" = 1 ] &&
     [ "${restarts[$name]:-0}" -lt "$max_server_restarts" ]; then
    restarts[$name]=$((${restarts[$name]:-0} + 1))
    how="it restores the latest checkpoint"
    [ "$replicated" = 1 ] && how="its backup serves its shards meanwhile and then hands them back"
    echo "launch_local.sh: $name exited with status $status; restarting it (restart ${restarts[$name]} of at most $max_server_restarts): $how" >&2
    start_server "${name#server-}" "${restarts[$name]}"
    continue
  fi
  if [ "$status" -ne 0 ] && [[ "$name" == server-* ]] && [ "$replicated" = 1 ]; then
    echo "launch_local.sh: $name exited with status $status; its backup takes over (--replicas=2)" >&2
    continue
  fi
  if [ "$status" -ne 0 ]; then
    echo "launch_local.sh: $name exited with status $status; stopping the job (log: $run_dir/logs/$name.log)" >&2
    tail -5 "$run_dir/logs/$name.log" >&2
    exit "$status"
  fi
done
wait "$console" 2>/dev/null
if [ -f "$run_dir/summary.json" ]; then
  echo "summary: $run_dir/summary.json"
fi
exit "$rc"
