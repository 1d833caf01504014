#!/usr/bin/env bash
# Checks the shape rules a maintainer relies on (README, "For developers"):
#   1. worker/ includes nothing from server/ (the update rules both sides run live in common/);
#   2. ps_worker does not link RocksDB (given the build's bin folder);
#   3. no function in common/, server/ or worker/ is longer than 80 lines;
#   4. no source file there is longer than 800 lines.
# Generated code (the Cap'n Proto output lives in the build folder) is not looked at; a table
# of definitions marked `// code-shape: table` on the line above it may be longer. Function
# extents come from universal-ctags (its `end:` field), so a lambda counts toward the function
# that holds it.
#
#   scripts/check_code_shape.sh [BIN_DIR]
# Prints each breach and exits 1 if there is any, 0 otherwise.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bin_dir="${1:-${PS_BIN_DIR:-}}"
max_function_lines=80
max_file_lines=800
breaches=0
breach() {
  echo "check_code_shape: $*"
  breaches=$((breaches + 1))
}

if ! command -v ctags >/dev/null || ! ctags --version 2>/dev/null | grep -q Universal; then
  echo "check_code_shape: universal-ctags is needed (scripts/install_deps.sh installs it)" >&2
  exit 2
fi

# 1. worker/ against server/.
while IFS= read -r hit; do
  breach "worker/ includes server/: $hit"
done < <(grep -nE '^\s*#\s*include\s+"server/' worker/*.h worker/*.cc worker/*.cu 2>/dev/null || true)

# 2. ps_worker's libraries.
if [ -n "$bin_dir" ] && [ -x "$bin_dir/ps_worker" ]; then
  if ldd "$bin_dir/ps_worker" | grep -q librocksdb; then
    breach "$bin_dir/ps_worker links librocksdb (worker code must not pull in the server's store)"
  fi
fi

# 3 and 4. Sizes.
mapfile -t sources < <(ls common/*.h common/*.cc server/*.h server/*.cc worker/*.h worker/*.cc \
  2>/dev/null)
for f in "${sources[@]}"; do
  lines=$(wc -l <"$f")
  if [ "$lines" -gt "$max_file_lines" ]; then
    breach "$f has $lines lines (at most $max_file_lines)"
  fi
done
while IFS=$'\t' read -r length file name start; do
  # A table of definitions (the job's settings, say) may be long; it says so on the line above.
  if [ "$start" -gt 1 ] && sed -n "$((start - 1))p" "$file" | grep -q 'code-shape: table'; then
    continue
  fi
  breach "$file: $name is $length lines (at most $max_function_lines)"
done < <(ctags --fields=+ne --kinds-c++=f -o - "${sources[@]}" | awk -F'\t' -v max="$max_function_lines" '
  {
    start = ""; end = ""
    for (i = 4; i <= NF; i++) {
      if ($i ~ /^line:/) start = substr($i, 6)
      if ($i ~ /^end:/) end = substr($i, 5)
    }
    if (start != "" && end != "" && end - start + 1 > max) print end - start + 1 "\t" $2 "\t" $1 "\t" start
  }' | sort -rn)

if [ "$breaches" -gt 0 ]; then
  echo "check_code_shape: $breaches breach(es)"
  exit 1
fi
echo "check_code_shape: ok (${#sources[@]} files)"
