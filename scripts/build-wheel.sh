#!/usr/bin/env bash
# Builds ctrun's wheel from this checkout: dist/ctrun-VERSION-py3-none-
# manylinux_2_XX_ARCH.whl with ctrun and ctrund (on the environment's PATH
# once installed), the ctrun Python module (`import ctrun`, `python -m
# ctrun`) and libctrun_worker with its headers and CMake package
# (`ctrun.cmake_prefix_path()`).
#
#   scripts/build-wheel.sh             set up and build (scripts/setup.sh,
#                                      build.sh) into build/ (or
#                                      $CTRUN_BUILD_DIR), then pack into dist/
#   scripts/build-wheel.sh --no-build [--out DIR]
#                                      pack what $CTRUN_BUILD_DIR holds (the
#                                      wheel's test)
#
# The executables need nothing but glibc 2.34 or newer
# (scripts/check-binaries.sh refuses the wheel otherwise); libctrun_worker
# needs the shared libraries it was built with (Abseil, whose types its API
# uses, Gloo, gRPC, and NCCL where built with it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
build=1
out=dist
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0 ;;
    --out) out=$2; shift ;;
    *) echo "usage: $0 [--no-build] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
if [ $build = 1 ]; then
  scripts/setup.sh
  scripts/build.sh
fi
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$BUILD_DIR" --prefix "$prefix" >/dev/null
scripts/check-binaries.sh "$prefix/bin/ctrun" "$prefix/bin/ctrund"
glibc=$(scripts/check-binaries.sh --floor "$prefix/bin/ctrun" "$prefix/bin/ctrund")
python3 scripts/make_wheel.py --prefix "$prefix" \
  --python worker_lib/python/ctrun --glibc "$glibc" --out "$out"
