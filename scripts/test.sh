#!/usr/bin/env bash
# Sets up, builds, and runs every test through ctest.
# Arguments go to ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
# Tests' temporary files live here (TMPDIR), fresh for each run.
rm -rf "$BUILD_DIR/test-tmp" && mkdir -p "$BUILD_DIR/test-tmp"
# Every test bounds its own waits; this is the backstop for a hang.
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 300 -j "$(nproc)" "$@"
