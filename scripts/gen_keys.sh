#!/usr/bin/env bash
# Makes a job's CURVE keys: the pairs 'server' (coordinator and servers) and 'worker', mode
# 0600, and allowed_keys listing both (see common/security.h).
#
#   scripts/gen_keys.sh DIR [--name NAME --role server|worker]
#
# Uses ps_keygen from $PS_BIN_DIR (default build/bin). Existing pairs are kept. Options
# take `--name value` or `--name=value`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/options.sh"
dir=""
name=""
role="worker"
ps_split_options "--name --role" "--help" "$@" || exit 2
set -- "${PS_ARGS[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="$2"; shift 2 ;;
    --role) role="$2"; shift 2 ;;
    -h|--help) ps_usage "$0"; exit 0 ;;
    -*) echo "gen_keys.sh: unknown option '$1'" >&2; exit 2 ;;
    *)
      [ -z "$dir" ] || { echo "gen_keys.sh: one DIR only, got '$dir' and '$1'" >&2; exit 2; }
      dir="$1"; shift ;;
  esac
done
[ -n "$dir" ] || { ps_usage "$0" >&2; exit 2; }
bin="${PS_BIN_DIR:-$root/build/bin}"
[ -x "$bin/ps_keygen" ] || { echo "gen_keys.sh: $bin/ps_keygen is missing: build first" >&2; exit 1; }
if [ -n "$name" ]; then
  exec "$bin/ps_keygen" --keys_dir="$dir" --name="$name" --role="$role"
fi
exec "$bin/ps_keygen" --keys_dir="$dir"
