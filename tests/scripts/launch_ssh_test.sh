#!/usr/bin/env bash
# scripts/launch_ssh.sh through a real sshd on 127.0.0.1, started here with its own config,
# host key and client key under a temp dir: one epoch of the default job trains as it does
# through launch_local.sh, and a job whose worker fails stops with its status and leaves
# no process behind (PS_LAUNCHER_TEST_EPOCHS=15 trains the whole default job). Needs root (sshd logs in as root here); exits 77 (skip) otherwise.
set -uo pipefail
if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root to run sshd and log in as root"; exit 77; fi
root="${PS_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
bin="${PS_BIN_DIR:-$root/build/bin}"
fail() { echo "FAIL: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

tmp="$(mktemp -d /tmp/ps_launch_ssh_test.XXXXXX)"
sshd_pid=""
cleanup() {
  [ -n "$sshd_pid" ] && kill "$sshd_pid" 2>/dev/null && wait "$sshd_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

ssh-keygen -q -t ed25519 -N '' -f "$tmp/host_key" || fail "ssh-keygen"
ssh-keygen -q -t ed25519 -N '' -f "$tmp/client_key" || fail "ssh-keygen"
cp "$tmp/client_key.pub" "$tmp/authorized_keys"
port="$(free_port)"
cat >"$tmp/sshd_config" <<CONF
Port $port
ListenAddress 127.0.0.1
HostKey $tmp/host_key
AuthorizedKeysFile $tmp/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile $tmp/sshd.pid
CONF
mkdir -p /run/sshd  # sshd's privilege separation directory
/usr/sbin/sshd -D -f "$tmp/sshd_config" -E "$tmp/sshd.log" &
sshd_pid=$!
ssh_opts="-p $port -i $tmp/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5"
# Wait (bounded) until sshd accepts a login.
for ((i = 0; i < 100; i++)); do
  # shellcheck disable=SC2086
  ssh -T -o BatchMode=yes $ssh_opts 127.0.0.1 true </dev/null 2>/dev/null && break
  kill -0 "$sshd_pid" 2>/dev/null || { cat "$tmp/sshd.log"; fail "sshd exited"; }
  sleep 0.2
done
[ "$i" -lt 100 ] || { cat "$tmp/sshd.log"; fail "no ssh login to 127.0.0.1:$port within 20 s"; }

leftovers() { ps -eo pid=,args= | grep -F "$1" | grep -E 'ps_(coordinator|server|worker)' | grep -v grep || true; }

# 1. One epoch of the default job: 1 coordinator + 2 servers on one "host", 2 workers on another.
cat >"$tmp/hostfile" <<HOSTS
# test cluster: every host is this one
127.0.0.1 coordinator servers=2
root@127.0.0.1 workers=2 device=cpu
HOSTS
# A quarter of the default global batch: one epoch of 512 is only 117 updates, too few
# for the 0.80 check below on a loaded machine.
run="$tmp/run"
PS_REMOTE_BIN_DIR="$bin" timeout $((120 + 30 * ${PS_LAUNCHER_TEST_EPOCHS:-1})) bash "$root/scripts/launch_ssh.sh" --hostfile "$tmp/hostfile" \
  --run_dir "$run" --port "$(free_port)" --ssh_opts "$ssh_opts" -- --epochs="${PS_LAUNCHER_TEST_EPOCHS:-1}" --global_batch_size=128 >"$tmp/console" 2>&1
rc=$?
[ "$rc" = 0 ] || { tail -40 "$tmp/console"; fail "launch_ssh.sh exited with $rc"; }
grep -q '^\[coordinator@127.0.0.1\] epoch 1/' "$tmp/console" || { tail -20 "$tmp/console"; fail "no prefixed progress line"; }
grep -q '^\[worker-1@root@127.0.0.1\]' "$tmp/console" || fail "no prefixed worker output"
for f in summary.json metrics.jsonl logs/coordinator.out logs/server-1.log logs/worker-1.log; do
  [ -s "$run/$f" ] || fail "$run/$f is missing or empty"
done
python3 - "$run/summary.json" <<'PY' || fail "summary.json check"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["status"] == "ok", s.get("error")
assert s["test_accuracy"] >= 0.80, s["test_accuracy"]
assert set(s["examples_per_epoch"]) == {60000}, s["examples_per_epoch"]
assert len(s["workers"]) == 2 and len(s["servers"]) == 2
print(f"launch_ssh: test_accuracy {s['test_accuracy']:.4f} in {s['wall_seconds']:.1f}s")
PY
[ -z "$(leftovers "$run")" ] || fail "processes left behind: $(leftovers "$run")"

# 2. A worker that cannot start (no such GPU) stops the whole job with its status.
cat >"$tmp/hostfile2" <<HOSTS
127.0.0.1 coordinator servers=1 workers=1
127.0.0.1 workers=1 device=cuda:99
HOSTS
port2="$(free_port)"
PS_REMOTE_BIN_DIR="$bin" timeout 120 bash "$root/scripts/launch_ssh.sh" --hostfile "$tmp/hostfile2" \
  --run_dir "$tmp/run2" --port "$port2" --ssh_opts "$ssh_opts" -- --epochs=1 >"$tmp/console2" 2>&1
rc=$?
[ "$rc" != 0 ] || fail "a job with a failing worker exited 0"
grep -q "worker-1 exited with status" "$tmp/console2" || { tail -20 "$tmp/console2"; fail "no failure message"; }
# The remote processes end once their ssh connections close (bounded wait).
for ((i = 0; i < 100; i++)); do
  [ -z "$(leftovers "127.0.0.1:$port2")" ] && break
  sleep 0.1
done
[ -z "$(leftovers "127.0.0.1:$port2")" ] || fail "processes left behind: $(leftovers "127.0.0.1:$port2")"
echo "PASS"
