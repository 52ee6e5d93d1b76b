#!/usr/bin/env bash
# scripts/check-binaries.sh passes ctrun and ctrund as built, and refuses a
# program that needs one more shared library, or a newer glibc, naming it.
#
#   check_binaries_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir=$1
check=$2/scripts/check-binaries.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "check-binaries test: $*" >&2
  exit 1
}

"$check" "$build_dir/launcher/ctrun" "$build_dir/rendezvous/ctrund" ||
  fail "ctrun and ctrund as built do not pass"
[ "$("$check" --floor "$build_dir/launcher/ctrun")" = 2.34 ] ||
  fail "ctrun's glibc floor is not 2.34"

# One more shared library: zlib.
printf '#include <zlib.h>\nint main() { return zlibVersion()[0] == 0; }\n' \
  >"$work/extra.c"
cc "$work/extra.c" -o "$work/extra" -lz
if "$check" "$build_dir/launcher/ctrun" "$work/extra" 2>"$work/extra.err"; then
  fail "a program linking libz passed"
fi
grep -q "extra needs libz.so.1, a shared library outside glibc's" \
  "$work/extra.err" || fail "the refusal: $(cat "$work/extra.err")"
grep -q "ctrun needs" "$work/extra.err" && fail "ctrun named: $(cat "$work/extra.err")"

# A symbol of glibc 2.36.
printf '#include <stdlib.h>\nint main() { return arc4random() == 1; }\n' \
  >"$work/newer.c"
cc "$work/newer.c" -o "$work/newer"
if "$check" "$work/newer" 2>"$work/newer.err"; then
  fail "a program needing glibc 2.36 passed"
fi
grep -q "newer needs glibc 2.36 (arc4random), newer than the 2.34" \
  "$work/newer.err" || fail "the refusal: $(cat "$work/newer.err")"
echo "check-binaries test passed"
