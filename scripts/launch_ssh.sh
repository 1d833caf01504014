#!/usr/bin/env bash
# Starts a job across machines over ssh: the coordinator, servers and workers where a
# hostfile puts them. Like launch_local.sh it writes a run directory and returns the job's
# exit status, and it stops every process on failure, on Ctrl-C and on exit.
#
#   scripts/launch_ssh.sh --hostfile FILE [FLAGFILE] [--run_dir DIR] [--port P]
#                         [--remote_root DIR] [--ssh_opts "OPTS"] [--keys DIR | --insecure]
#                         [-- extra job flags]
#
# Every option is taken as `--name value` or `--name=value`.
# The hostfile names one host a line, then what runs there (# starts a comment):
#   10.0.0.1          coordinator servers=1     # the coordinator listens on 10.0.0.1:P
#   10.0.0.2          servers=1
#   alice@gpu-box-1   workers=2 device=cuda     # two GPU workers
#   10.0.0.4          workers=4 device=cpu slowdown=1
# Keys: coordinator (exactly one line), servers=N, workers=N, device=DEV (cpu, cuda,
# cuda:N, auto; workers), addr=A (the address processes there bind to and are reached at;
# default the host part after user@). Processes bind to that address, never to 0.0.0.0
# unless it says so. Servers and workers are numbered in hostfile order (--id).
#
# Each host must have the repository built at --remote_root (default: this checkout's
# path, as on a shared filesystem) and passwordless ssh from here. Every process's output
# streams to this console with a "[name@host]" prefix and into RUN_DIR/logs/NAME.log; the
# coordinator writes metrics.jsonl and summary.json into RUN_DIR on its host (copied here
# at the end when this is not a shared filesystem). --ssh_opts are passed to every ssh
# (e.g. "-p 2222 -i ~/.ssh/cluster_key"). Closing an ssh connection (Ctrl-C, a failure)
# stops the process at its other end.
# Traffic is authenticated and encrypted (CurveZMQ): keys are made here in RUN_DIR/keys
# (or --keys DIR) and copied over ssh to the same path on every host (mode 0600);
# --insecure turns security off, which the binaries refuse for non-loopback addresses.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

hostfile=""
flagfile="$root/configs/fashion_mnist_mlp.flags"
run_dir=""
port=7000
remote_root="$root"
ssh_opts=""
keys=""
insecure=0
extra=()
source "$root/scripts/lib/options.sh"
usage() { ps_usage "$0"; }
ps_split_options "--hostfile --run_dir --port --remote_root --ssh_opts --keys" "--insecure --help" \
  "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    --hostfile) hostfile="$2"; shift 2 ;;
    --run_dir) run_dir="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --remote_root) remote_root="$2"; shift 2 ;;
    --ssh_opts) ssh_opts="$2"; shift 2 ;;
    --keys) keys="$2"; shift 2 ;;
    --insecure) insecure=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "launch_ssh.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) flagfile="$1"; shift ;;
  esac
done
[ -n "$hostfile" ] || { echo "launch_ssh.sh: --hostfile FILE is required" >&2; usage >&2; exit 2; }
[ -f "$hostfile" ] || { echo "launch_ssh.sh: hostfile '$hostfile' not found" >&2; exit 2; }
[ -f "$flagfile" ] || { echo "launch_ssh.sh: flagfile '$flagfile' not found" >&2; exit 2; }
[[ "$port" =~ ^[1-9][0-9]*$ ]] && [ "$port" -le 65535 ] ||
  { echo "launch_ssh.sh: --port must be a port number, got '$port'" >&2; exit 2; }
flagfile="$(cd "$(dirname "$flagfile")" && pwd)/$(basename "$flagfile")"
# The flagfile as the remote hosts see it: the same path under --remote_root.
remote_flagfile="$remote_root/${flagfile#"$root"/}"
read -r -a ssh_args <<<"$ssh_opts"

# ---- the hostfile ----
coord_host="" coord_addr=""
server_hosts=() server_addrs=()
worker_hosts=() worker_addrs=() worker_devices=() worker_slowdowns=()
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  line="${line%%#*}"
  read -r -a words <<<"$line"
  [ ${#words[@]} -gt 0 ] || continue
  host="${words[0]}"
  addr="${host#*@}"
  n_servers=0 n_workers=0 device=cpu slowdown=1 is_coord=0
  for w in "${words[@]:1}"; do
    case "$w" in
      coordinator) is_coord=1 ;;
      servers=*) n_servers="${w#servers=}" ;;
      workers=*) n_workers="${w#workers=}" ;;
      device=*) device="${w#device=}" ;;
      slowdown=*) slowdown="${w#slowdown=}" ;;
      addr=*) addr="${w#addr=}" ;;
      *) echo "launch_ssh.sh: $hostfile:$lineno: unknown entry '$w' (expected coordinator, servers=N, workers=N, device=DEV, slowdown=F, addr=A)" >&2; exit 2 ;;
    esac
  done
  for v in n_servers n_workers; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "launch_ssh.sh: $hostfile:$lineno: ${v#n_}= must be a count, got '${!v}'" >&2; exit 2; }
  done
  if [ "$is_coord" = 1 ]; then
    [ -z "$coord_host" ] || { echo "launch_ssh.sh: $hostfile:$lineno: a second coordinator (the first is on $coord_host)" >&2; exit 2; }
    coord_host="$host" coord_addr="$addr"
  fi
  for ((i = 0; i < n_servers; i++)); do server_hosts+=("$host"); server_addrs+=("$addr"); done
  for ((i = 0; i < n_workers; i++)); do
    worker_hosts+=("$host"); worker_addrs+=("$addr"); worker_devices+=("$device"); worker_slowdowns+=("$slowdown")
  done
done <"$hostfile"
[ -n "$coord_host" ] || { echo "launch_ssh.sh: $hostfile names no coordinator line" >&2; exit 2; }
[ ${#server_hosts[@]} -gt 0 ] || { echo "launch_ssh.sh: $hostfile names no servers (servers=N)" >&2; exit 2; }
[ ${#worker_hosts[@]} -gt 0 ] || { echo "launch_ssh.sh: $hostfile names no workers (workers=N)" >&2; exit 2; }
servers=${#server_hosts[@]}
workers=${#worker_hosts[@]}
endpoint="tcp://$coord_addr:$port"

[ -n "$run_dir" ] || run_dir="$root/runs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run_dir/logs"
run_dir="$(cd "$run_dir" && pwd)"
bin="${PS_REMOTE_BIN_DIR:-$remote_root/build/bin}"

# ---- keys: made here, copied to every host under the same path ----
security=()
if [ "$insecure" = 1 ]; then
  [ -z "$keys" ] || { echo "launch_ssh.sh: --keys and --insecure contradict each other" >&2; exit 2; }
  echo "launch_ssh.sh: WARNING: --insecure: no authentication, no encryption" >&2
  security=(--insecure)
else
  if [ -z "$keys" ]; then
    keys="$run_dir/keys"
    "${PS_BIN_DIR:-$root/build/bin}/ps_keygen" --keys_dir="$keys" >/dev/null ||
      { echo "launch_ssh.sh: ps_keygen failed (build first, or give --keys DIR)" >&2; exit 1; }
  fi
  [ -f "$keys/server.secret" ] || { echo "launch_ssh.sh: $keys/server.secret not found (make keys with scripts/gen_keys.sh DIR)" >&2; exit 2; }
  keys="$(cd "$keys" && pwd)"
  security=(--keys_dir="$keys")
  # Every host gets the same files at the same path; a host that already sees them (this
  # one, a shared filesystem) is left alone: unpacking over the files being read would
  # truncate them.
  qkeys="$(printf '%q' "$keys")"
  for h in $(printf '%s\n' "$coord_host" "${server_hosts[@]}" "${worker_hosts[@]}" | sort -u); do
    tar -C "$keys" -cf - . | ssh -T -o BatchMode=yes "${ssh_args[@]}" "$h" \
      "if [ -f $qkeys/server.secret ]; then cat >/dev/null; else umask 077 && mkdir -p $qkeys && tar -C $qkeys -xpf -; fi" ||
      { echo "launch_ssh.sh: could not copy the keys to $h" >&2; exit 1; }
  done
fi

# The remote end of every process: run it, and stop it when the ssh connection closes
# (its stdin reaches EOF), so that no process outlives the launcher.
remote_cmd() {
  local q
  q="$(printf '%q ' "$@")"
  printf 'cd %q && export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} && exec 3<&0 && { %s </dev/null & pid=$!; { cat >/dev/null; kill -TERM $pid 2>/dev/null; } <&3 >/dev/null 2>&1 & wait $pid; }' \
    "$remote_root" "$q"
}

pids=() names=()
stop_all() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  local deadline=$((SECONDS + 10))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  pids=()
  [ -n "${fifo_dir:-}" ] && rm -rf "$fifo_dir"
}
trap 'echo "launch_ssh.sh: interrupted, stopping the job" >&2; stop_all; exit 130' INT TERM
trap 'stop_all' EXIT

# start NAME HOST OUT_LOG ERR_LOG COMMAND...: runs COMMAND on HOST over ssh; stdout to
# OUT_LOG, stderr to ERR_LOG, both to the console with a prefix. Its stdin is a pipe this
# script holds open, so ssh ends (and the remote process with it) when this script does.
start() {
  local name="$1" host="$2" out="$3" err="$4"
  shift 4
  local in
  exec {in}<"$stdin_fifo"  # opened here, before the fork: it never races the rm below
  ssh -T -o BatchMode=yes "${ssh_args[@]}" "$host" "$(remote_cmd "$@")" <&"$in" 9>&- {in}<&- \
    > >(exec 9>&- {in}<&-; tee -a "$out" | sed -u "s|^|[$name@$host] |") \
    2> >(exec 9>&- {in}<&-; tee -a "$err" | sed -u "s|^|[$name@$host] |" >&2) &
  pids+=($!); names+=("$name")
  exec {in}<&-
}
# Every ssh reads this FIFO, which only this script holds open for writing (fd 9) and never
# writes: it reaches EOF when this script exits, however it exits (SIGKILL included).
fifo_dir="$(mktemp -d "${TMPDIR:-/tmp}/launch_ssh.XXXXXX")"
stdin_fifo="$fifo_dir/stdin"
mkfifo "$stdin_fifo"
exec 9<>"$stdin_fifo"

echo "run directory: $run_dir"
echo "coordinator $endpoint; $servers servers, $workers workers"
start coordinator "$coord_host" "$run_dir/logs/coordinator.out" "$run_dir/logs/coordinator.log" \
  "$bin/ps_coordinator" --flagfile="$remote_flagfile" --num_servers="$servers" \
  --num_workers="$workers" --listen="$endpoint" --run_dir="$run_dir" "${security[@]}" "${extra[@]}"
coord=${pids[0]}
for ((i = 0; i < servers; i++)); do
  log="$run_dir/logs/server-$i.log"
  start "server-$i" "${server_hosts[$i]}" "$log" "$log" "$bin/ps_server" --coordinator="$endpoint" \
    --listen="tcp://${server_addrs[$i]}:*" --id="$i" "${security[@]}"
done
for ((i = 0; i < workers; i++)); do
  log="$run_dir/logs/worker-$i.log"
  start "worker-$i" "${worker_hosts[$i]}" "$log" "$log" "$bin/ps_worker" --coordinator="$endpoint" \
    --id="$i" --device="${worker_devices[$i]}" --slowdown="${worker_slowdowns[$i]}" "${security[@]}"
done

rm -rf "$fifo_dir"  # every ssh has it open; the name is no longer needed

# Wait for the coordinator; stop early when any other process fails.
rc=0
while true; do
  finished=""
  wait -n -p finished "${pids[@]}"
  status=$?
  [ -n "$finished" ] || break
  for idx in "${!pids[@]}"; do [ "${pids[$idx]}" = "$finished" ] && break; done
  name="${names[$idx]}"
  unset 'pids[idx]' 'names[idx]'
  pids=("${pids[@]}"); names=("${names[@]}")
  if [ "$finished" = "$coord" ]; then
    rc=$status
    break
  fi
  if [ "$status" -ne 0 ]; then
    echo "launch_ssh.sh: $name exited with status $status; stopping the job (log: $run_dir/logs/$name.log)" >&2
    exit "$status"
  fi
done
# Not a shared filesystem: fetch the coordinator's results.
for f in summary.json metrics.jsonl; do
  if [ ! -s "$run_dir/$f" ]; then
    if ssh -T -o BatchMode=yes "${ssh_args[@]}" "$coord_host" "cat $(printf '%q' "$run_dir/$f")" \
      >"$run_dir/$f.part" </dev/null 2>/dev/null; then
      mv "$run_dir/$f.part" "$run_dir/$f"
    else
      rm -f "$run_dir/$f.part"
    fi
  fi
done
[ -f "$run_dir/summary.json" ] && echo "summary: $run_dir/summary.json"
exit "$rc"
