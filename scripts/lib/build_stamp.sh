# Stamps of what the package and build checks last found (sourced, not run), so that a
# launcher skips both when nothing they look at has changed since: two processes (git
# status, stat) instead of dpkg queries, a CMake configure and a make pass.
#
# Two stamps in the build directory (PS_BUILD_DIR, default build/), each holding a key as
# plain text (cat one to see what it covers):
#   .ps_deps_stamp   written by install_deps.sh once every package is present: the size and
#                    time of install_deps.sh (its package list) and of dpkg's status file,
#                    which changes with every install and removal on the machine;
#   .ps_build_stamp  written by build.sh after a build that succeeded, with the key taken
#                    before it configured: the packages' key (an upgraded library relinks),
#                    PS_BUILD_TYPE and build.sh's arguments, and the source tree as git sees
#                    it: HEAD, every changed, staged or untracked path that is not ignored,
#                    and the size and time of each (the tree's content is HEAD's but for
#                    those files). A file edited during the build therefore
#                    leaves a stamp that no longer matches; so does a CMake cache newer than
#                    the stamp (someone configured by hand since).
# A tree that is not a git checkout has no build key: nothing is skipped there.

# ps_build_dir ROOT: sets PS_BUILD to the build directory.
ps_build_dir() { PS_BUILD="${PS_BUILD_DIR:-$1/build}"; }

# ps_deps_key ROOT: prints the packages' key.
ps_deps_key() { stat -c '%n %s %.9Y' -- "$1/scripts/install_deps.sh" /var/lib/dpkg/status 2>&1; }

# ps_build_key ROOT [BUILD_SH_ARGS...]: prints the build key; nothing when the tree is not a
# git checkout or git fails.
ps_build_key() {
  local root="$1" status line path
  shift
  local paths=("$root/scripts/install_deps.sh" /var/lib/dpkg/status) records=()
  # Porcelain v2 ends each record with the path (then, for a rename, a tab and the old path).
  status="$(git -C "$root" --no-optional-locks status --porcelain=v2 --branch \
    --untracked-files=all 2>/dev/null)" || return 0
  [[ "$status" == *"# branch.oid "[0-9a-f]* ]] || return 0
  while IFS= read -r line; do
    case "$line" in
      '# branch.oid '*) records+=("$line"); continue ;;
      '#'*) continue ;;  # the branch's name and upstream do not change what is built
      '? '*) path="${line#? }" ;;
      '1 '*) path="${line#* * * * * * * * }" ;;  # 8 fields, then the path
      '2 '*) path="${line#* * * * * * * * * }" ;;  # 9 fields, the path, a tab, the old path
      'u '*) path="${line#* * * * * * * * * * }" ;;
      *) continue ;;
    esac
    # The path alone: staging a change alters the record's other fields, not the tree.
    records+=("$path")
    paths+=("$root/${path%%$'\t'*}")
  done <<<"$status"
  printf 'PS_BUILD_TYPE=%s\n' "${PS_BUILD_TYPE:-}"
  printf 'arg %s\n' "$@"
  printf '%s\n' "${records[@]}"
  stat -c '%n %s %.9Y' -- "${paths[@]}" 2>&1
}

# ps_stamp_matches FILE KEY: the stamp holds KEY (and KEY is not empty).
ps_stamp_matches() { [ -n "$2" ] && [ -f "$1" ] && [ "$(<"$1")" = "$2" ]; }

# ps_ensure_built ROOT LOG: runs install_deps.sh and build.sh (its output into LOG) unless
# their stamps match. Returns non-zero, after the end of the build log, when a check fails.
ps_ensure_built() {
  local root="$1" log="$2"
  ps_build_dir "$root"
  if ! ps_stamp_matches "$PS_BUILD/.ps_deps_stamp" "$(ps_deps_key "$root")"; then
    bash "$root/scripts/install_deps.sh" || return 1
  fi
  if ps_stamp_matches "$PS_BUILD/.ps_build_stamp" "$(ps_build_key "$root")" &&
    ! [ "$PS_BUILD/CMakeCache.txt" -nt "$PS_BUILD/.ps_build_stamp" ]; then
    return 0
  fi
  mkdir -p "$PS_BUILD"
  echo "building into $PS_BUILD (log: $log)"
  if ! bash "$root/scripts/build.sh" >"$log" 2>&1; then
    tail -50 "$log"
    echo "$(basename "$0"): build failed (log: $log)" >&2
    return 1
  fi
}
