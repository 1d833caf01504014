#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the default job need.
# Idempotent: packages already present are skipped by apt; safe to run again.
# Nothing is downloaded from anywhere but Debian's archive; nothing is vendored.
# Once every package is present it writes the packages' stamp in the build directory, which
# lets launch_local.sh skip these queries until the list or dpkg's database changes
# (scripts/lib/build_stamp.sh).
#
#   scripts/install_deps.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
source "$root/scripts/lib/build_stamp.sh"
case "${1:-}" in
  "") ;;
  -h|--help) ps_usage "$0"; exit 0 ;;
  *) echo "install_deps.sh: takes no arguments, got '$1'" >&2; exit 2 ;;
esac
# Records that every package is present (best effort: a read-only tree only loses the fast path).
stamp() {
  ps_build_dir "$root"
  { mkdir -p "$PS_BUILD" && ps_deps_key "$root" >"$PS_BUILD/.ps_deps_stamp"; } 2>/dev/null || true
}

PACKAGES=(
  build-essential cmake pkg-config git
  libzmq3-dev cppzmq-dev            # transport (ZeroMQ + its C++ binding)
  capnproto libcapnp-dev            # wire schema
  librocksdb-dev                    # spill tier, checkpoints
  libgflags-dev libgoogle-glog-dev  # flags (binaries only), logging
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev                   # CPU matrix products
  nlohmann-json3-dev                # metrics.jsonl / summary.json
  libxxhash-dev                     # key hashing for the shard map
  prometheus-cpp-dev                # --metrics_port: Prometheus pull endpoint (common/metrics.h)
  python3-matplotlib                # scripts/plot_run.py
  dataset-fashion-mnist             # the default job's data
  zlib1g-dev                        # gzip-compressed IDX files
  clang-14 libclang-rt-14-dev       # libFuzzer + sanitizer runtimes (scripts/fuzz.sh)
  python3 procps
  universal-ctags                   # scripts/check_code_shape.sh (function lengths)
  openssh-server openssh-client     # tests/scripts: scripts/launch_ssh.sh against a local sshd
  slurm-wlm munge                   # tests/scripts: scripts/slurm/ps_job.sbatch on a one-node Slurm
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  stamp
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
stamp
