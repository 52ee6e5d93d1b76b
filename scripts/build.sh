#!/usr/bin/env bash
# Configures and builds ctrun into build/ (or $CTRUN_BUILD_DIR) with Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$BUILD_DIR"
