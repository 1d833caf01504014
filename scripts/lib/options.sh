# Option words shared by the scripts (sourced, not run): every option is accepted as
# `--name value` and as `--name=value`, as the project's binaries (gflags) take them.
#
#   source "$root/scripts/lib/options.sh"
#   ps_split_options "--servers --workers" "--no_build" "$@" || exit 2
#   set -- "${PS_ARGS[@]}"
#   while [ $# -gt 0 ]; do
#     case "$1" in --servers) servers="$2"; shift 2 ;; --no_build) build=0; shift ;; ... esac
#   done
#
# ps_split_options VALUE_OPTIONS SWITCHES ARGS...
#   Sets the array PS_ARGS to ARGS with every `--name=value` of an option named in
#   VALUE_OPTIONS (space-separated) split into the two words `--name` `value`. The word after
#   a value option is its value whatever it looks like (`--worker_flags --prefetch=false`),
#   and is copied as it is. Everything from a lone `--` on is copied as it is (the flags it
#   introduces belong to someone else). Other words are copied as they are: the script's own
#   loop reports what it does not know. Returns 2 after a message on stderr for a value
#   option without its value and for `--name=value` of a switch (an option named in SWITCHES,
#   which takes no value).
#
# The message names the script ($0) so that callers only need `|| exit 2`.
ps_split_options() {
  local values=" $1 " switches=" $2 " name
  shift 2
  PS_ARGS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --)
        PS_ARGS+=("$@")
        return 0
        ;;
      --*=*)
        name="${1%%=*}"
        if [[ "$values" == *" $name "* ]]; then
          PS_ARGS+=("$name" "${1#*=}")
        elif [[ "$switches" == *" $name "* ]]; then
          echo "$(basename "$0"): $name takes no value (got '$1')" >&2
          return 2
        else
          PS_ARGS+=("$1")
        fi
        ;;
      *)
        if [[ "$1" == --* && "$values" == *" $1 "* ]]; then
          if [ $# -lt 2 ]; then
            echo "$(basename "$0"): $1 needs a value ($1 VALUE or $1=VALUE)" >&2
            return 2
          fi
          PS_ARGS+=("$1" "$2")
          shift
        else
          PS_ARGS+=("$1")
        fi
        ;;
    esac
    shift
  done
  return 0
}

# Prints the comment block at the top of a script (its usage), without the '#'s.
ps_usage() { sed -n '2,/^[^#]/p' "$1" | grep '^#' | sed 's/^# \{0,1\}//'; }
