#!/usr/bin/env bash
# The launchers' fast path (scripts/lib/build_stamp.sh) in a scratch git repository whose
# scripts/build.sh is the real one and whose cmake and install_deps.sh only record that they
# ran: after a build nothing runs again until something it covers changes (a tracked file, a
# staged change, an untracked file, the package list, build.sh's arguments, a CMake cache
# configured by hand), and then the build runs once more.
set -uo pipefail
src="${PS_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp="$(mktemp -d /tmp/ps_build_stamp_test.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
repo="$tmp/repo"
mkdir -p "$repo/scripts/lib" "$repo/src" "$tmp/fakebin"
cp "$src/scripts/build.sh" "$repo/scripts/"
cp "$src/scripts/lib/build_stamp.sh" "$src/scripts/lib/options.sh" "$repo/scripts/lib/"
# install_deps.sh: records its run and writes the packages' stamp, as the real one does.
cat >"$repo/scripts/install_deps.sh" <<'EOF'
#!/usr/bin/env bash
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/lib/build_stamp.sh"
echo deps >>"$root/../ran"
ps_build_dir "$root"; mkdir -p "$PS_BUILD"; ps_deps_key "$root" >"$PS_BUILD/.ps_deps_stamp"
EOF
# cmake: a configure makes the cache once; a build records its run.
cat >"$tmp/fakebin/cmake" <<'EOF'
#!/usr/bin/env bash
if [ "$1" = --build ]; then echo build >>"$(dirname "$2")/../ran"; exit 0; fi
while [ $# -gt 0 ]; do [ "$1" = -B ] && { [ -f "$2/CMakeCache.txt" ] || : >"$2/CMakeCache.txt"; }; shift; done
EOF
chmod +x "$tmp/fakebin/cmake" "$repo/scripts/"*.sh
echo 'int main() {}' >"$repo/src/main.cc"
printf 'build/\n' >"$repo/.gitignore"
git -C "$repo" init -q && git -C "$repo" add -A &&
  git -C "$repo" -c user.name=t -c user.email=t@example.com commit -qm init || fail "git"
export PATH="$tmp/fakebin:$PATH"
unset PS_BUILD_DIR PS_BUILD_TYPE

# expect WHAT STEP: ps_ensure_built, after STEP, ran WHAT ("deps build", "build" or "").
expect() {
  local got=""
  rm -f "$tmp/ran"
  (source "$repo/scripts/lib/build_stamp.sh" && ps_ensure_built "$repo" "$tmp/build.log" >/dev/null) ||
    fail "$2: ps_ensure_built failed: $(cat "$tmp/build.log")"
  [ -f "$tmp/ran" ] && got="$(tr '\n' ' ' <"$tmp/ran")" && got="${got% }"
  [ "$got" = "$1" ] || fail "$2: ran '$got', expected '$1'"
  echo "ok: $2: ran '${got}'"
}
expect "deps build" "first launch"
expect "" "nothing changed"
echo 'int f() { return 1; }' >>"$repo/src/main.cc"
expect "build" "a tracked file edited"
expect "" "nothing changed since"
sleep 0.01
echo 'int g() { return 2; }' >>"$repo/src/main.cc"
expect "build" "the same file edited again"
git -C "$repo" add src/main.cc
expect "" "the change staged (same content)"
echo 'int h;' >"$repo/src/new.cc"
expect "build" "an untracked file"
echo 'x' >"$repo/build/ignored.o"
expect "" "an ignored file"
rm "$repo/src/new.cc"
expect "build" "the untracked file removed"
git -C "$repo" -c user.name=t -c user.email=t@example.com commit -qam edit || fail "git commit"
expect "build" "a commit"
echo '# one more package' >>"$repo/scripts/install_deps.sh"
expect "deps build" "the package list changed"
(cd "$repo" && PS_BUILD_TYPE=Debug bash scripts/build.sh >/dev/null) || fail "build.sh"
expect "build" "the last build had another build type"
sleep 0.01
touch "$repo/build/CMakeCache.txt"
expect "build" "configured by hand since"
rm "$repo/build/.ps_build_stamp"
expect "build" "no stamp"
# A build that fails leaves no stamp: the next launch builds again.
printf '#!/usr/bin/env bash\n[ "$1" = --build ] && exit 1; exit 0\n' >"$tmp/fakebin/cmake"
echo 'int k;' >>"$repo/src/main.cc"
rm -f "$tmp/ran"
(source "$repo/scripts/lib/build_stamp.sh" && ps_ensure_built "$repo" "$tmp/build.log" >/dev/null 2>&1) &&
  fail "a failed build passed"
[ ! -e "$repo/build/.ps_build_stamp" ] || fail "a failed build left a stamp"
echo "ok: a failed build leaves no stamp"
