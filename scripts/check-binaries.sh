#!/usr/bin/env bash
# Checks that executables run on any Linux with glibc 2.34 or newer, as the
# wheel promises (scripts/build-wheel.sh): they need no shared library but
# glibc's own, and no glibc symbol version newer than 2.34.
#
#   scripts/check-binaries.sh FILE...          exit 1, naming each problem
#   scripts/check-binaries.sh --floor FILE...  prints the newest glibc
#                                              version they need (2.34)
set -euo pipefail
readonly GLIBC_FLOOR=2.34
readonly ALLOWED="libc.so.6
libm.so.6
libdl.so.2
libpthread.so.0
librt.so.1
ld-linux-x86-64.so.2
ld-linux-aarch64.so.1"

floor_only=0
if [ "${1:-}" = --floor ]; then
  floor_only=1
  shift
fi
[ $# -gt 0 ] || { echo "usage: $0 [--floor] FILE..." >&2; exit 2; }

# The newest GLIBC_x.y that `file` asks for.
glibc_needed() {
  objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' |
    sort -V | tail -1
}

newest=0
problems=0
for file in "$@"; do
  if ! readelf -h "$file" >/dev/null 2>&1; then
    echo "check-binaries: $file is not an ELF file" >&2
    exit 2
  fi
  while read -r lib; do
    if ! grep -qxF -- "$lib" <<<"$ALLOWED"; then
      echo "check-binaries: $file needs $lib, a shared library outside" \
        "glibc's (link it statically, or dlopen it when its" \
        "flag asks)" >&2
      problems=$((problems + 1))
    fi
  done < <(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  needed=$(glibc_needed "$file")
  needed=${needed:-0}
  if [ "$(printf '%s\n' "$needed" "$GLIBC_FLOOR" | sort -V | tail -1)" != \
    "$GLIBC_FLOOR" ]; then
    symbols=$(objdump -T "$file" | awk -v v="GLIBC_$needed" \
      '$0 ~ "\\(" v "\\)" {print $NF}' | sort -u | tr '\n' ' ')
    echo "check-binaries: $file needs glibc $needed (${symbols% }), newer" \
      "than the $GLIBC_FLOOR the wheel promises" >&2
    problems=$((problems + 1))
  fi
  newest=$(printf '%s\n' "$newest" "$needed" | sort -V | tail -1)
done
if [ $floor_only = 1 ]; then
  echo "$newest"
  exit 0
fi
[ $problems = 0 ] || exit 1
echo "check-binaries: $# files need glibc $newest at most and no other" \
  "shared library"
