#!/usr/bin/env bash
# Builds the whole tree (launcher, daemon, worker library, tests, benchmarks)
# with clang, whose -Wthread-safety turns every ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED and lock annotation into a compile-time
# check (an error here; see CMakeLists.txt). This stands in for
# ThreadSanitizer, which Debian's uninstrumented gRPC and Abseil rule out.
#
#   scripts/check-thread-safety.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --fuzz  # clang
BUILD_DIR=${CTRUN_CLANG_BUILD_DIR:-build-clang}
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$BUILD_DIR"
echo "thread-safety: every lock annotation holds"
