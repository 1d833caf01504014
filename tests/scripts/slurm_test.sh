#!/usr/bin/env bash
# scripts/slurm/ps_job.sbatch on a real single-node Slurm on 127.0.0.1: munged, slurmctld
# and slurmd are started here with a slurm.conf of their own under a temp dir (SLURM_CONF),
# and one epoch of the default job trains as it does through launch_local.sh. Needs root
# (PS_LAUNCHER_TEST_EPOCHS=15: the whole default job; the daemons run as root); exits 77 (skip) otherwise.
set -uo pipefail
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root to run munged, slurmctld and slurmd"; exit 77; fi
root="${PS_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
bin="${PS_BIN_DIR:-$root/build/bin}"
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.log "$tmp"/job.out; do [ -f "$f" ] && { echo "---- $f"; tail -15 "$f"; } >&2; done
  exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

tmp="$(mktemp -d /tmp/ps_slurm_test.XXXXXX)"
chmod 755 "$tmp"
daemons=()
cleanup() {
  local pid
  [ -n "${job:-}" ] && scancel "$job" 2>/dev/null
  for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${daemons[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# munge: its own key, socket and files.
mkdir -p "$tmp/munge"
chmod 711 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
munged --foreground --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.socket" \
  --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/munged.log" --seed-file="$tmp/munge/seed" \
  >"$tmp/munged.console.log" 2>&1 &
daemons+=($!)

mkdir -p "$tmp/state" "$tmp/spool"
export SLURM_CONF="$tmp/slurm.conf"
cat >"$SLURM_CONF" <<CONF
ClusterName=pstest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.socket
CryptoType=crypto/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
# Wait (bounded) for munged's socket.
for ((i = 0; i < 100; i++)); do [ -S "$tmp/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$tmp/munge/munge.socket" ] || fail "munged did not start"
slurmctld -D -i >"$tmp/slurmctld.console.log" 2>&1 &
daemons+=($!)
slurmd -D -N localhost >"$tmp/slurmd.console.log" 2>&1 &
daemons+=($!)
for ((i = 0; i < 150; i++)); do
  state="$(sinfo -h -o %T 2>/dev/null || true)"
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || fail "the node is not idle within 30 s (state '$state')"

# A quarter of the default global batch: one epoch of 512 is only 117 updates, too few
# for the 0.80 check below on a loaded machine.
run="$tmp/run"
job="$(PS_PORT="$(free_port)" PS_RUN_DIR="$run" PS_BIN_DIR="$bin" PS_ROOT="$root" sbatch --parsable --nodes=1 \
  --ntasks=5 --overcommit --output="$tmp/job.out" --chdir="$root" \
  "$root/scripts/slurm/ps_job.sbatch" -- --epochs="${PS_LAUNCHER_TEST_EPOCHS:-1}" --global_batch_size=128)" || fail "sbatch refused the job"
job="${job%%;*}"
# No accounting: poll the controller until the job has ended (bounded).
limit=$((120 + 30 * ${PS_LAUNCHER_TEST_EPOCHS:-1}))
deadline=$((SECONDS + limit))
while :; do
  state="$(scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)"
  case "$state" in
    COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|"") break ;;
  esac
  [ $SECONDS -lt $deadline ] || fail "job $job still $state after $limit s"
  sleep 0.5
done
[ "$state" = COMPLETED ] || fail "job $job ended $state"
grep -q '^epoch 1/1' "$tmp/job.out" || fail "no progress line in the job's output"
python3 - "$run/summary.json" <<'PY' || fail "summary.json check"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["status"] == "ok", s.get("error")
assert s["test_accuracy"] >= 0.80, s["test_accuracy"]
assert set(s["examples_per_epoch"]) == {60000}, s["examples_per_epoch"]
assert len(s["workers"]) == 2 and len(s["servers"]) == 2
print(f"slurm: test_accuracy {s['test_accuracy']:.4f} in {s['wall_seconds']:.1f}s")
PY
[ $? = 0 ] || exit 1
for f in server-0.log server-1.log worker-0.log worker-1.log coordinator.log; do
  [ -s "$run/logs/$f" ] || fail "$run/logs/$f is missing"
done
echo "PASS"
