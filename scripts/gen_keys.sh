#!/usr/bin/env bash
# Makes a job's CURVE keys: the pairs 'server' (coordinator and servers) and 'worker', mode
# 0600, and allowed_keys listing both (see common/security.h).
#
#   scripts/gen_keys.sh DIR [--name NAME --role server|worker]
#
# Uses ps_keygen from $PS_BIN_DIR (default build/bin). Existing pairs are kept.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 1 ] || { sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2; }
dir="$1"
shift
name=""
role="worker"
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --role) role="$2"; shift 2 ;;
    *) echo "gen_keys.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
bin="${PS_BIN_DIR:-$root/build/bin}"
[ -x "$bin/ps_keygen" ] || { echo "gen_keys.sh: $bin/ps_keygen is missing: build first" >&2; exit 1; }
if [ -n "$name" ]; then
  exec "$bin/ps_keygen" --keys_dir="$dir" --name="$name" --role="$role"
fi
exec "$bin/ps_keygen" --keys_dir="$dir"
