#!/usr/bin/env bash
# Sets up, builds, and runs every test through ctest.
#
#   scripts/test.sh [--sanitize=address,undefined|thread] [CTEST ARGS...]
#
# Other arguments go to ctest, e.g. `scripts/test.sh -L unit`. With
# --sanitize, everything is built with those sanitizers into its own build
# directory (build-asan-ubsan, build-tsan) and any report fails its test.
# (The suite passes under address,undefined; see README.md for thread.)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
if [[ "${1:-}" == --sanitize=* ]]; then
  sanitize=${1#--sanitize=}
  shift
  case "$sanitize" in
    address,undefined | undefined,address) default_dir=build-asan-ubsan ;;
    address) default_dir=build-asan ;;
    undefined) default_dir=build-ubsan ;;
    thread) default_dir=build-tsan ;;
    *)
      echo "test.sh: --sanitize=$sanitize: expected address,undefined," \
        "address, undefined or thread" >&2
      exit 2
      ;;
  esac
  export CTRUN_BUILD_DIR=${CTRUN_BUILD_DIR:-$default_dir}
  # A report ends the process with an error, so the test fails.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1:halt_on_error=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
fi
scripts/setup.sh
scripts/build.sh ${sanitize:+-DCTRUN_SANITIZE=$sanitize}
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
# Tests' temporary files live here (TMPDIR), fresh for each run.
rm -rf "$BUILD_DIR/test-tmp" && mkdir -p "$BUILD_DIR/test-tmp"
# A ';' in a Catch test's name splits it, for CMake, into entries that
# match no test and pass having run nothing.
if split=$(ctest --test-dir "$BUILD_DIR" -N | grep -E '#[0-9]+: [a-z_]+: '); then
  echo "test.sh: test names split at ';' (use another separator):" >&2
  echo "$split" >&2
  exit 1
fi
# Every test bounds its own waits; this is the backstop for a hang.
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 300 -j "$(nproc)" "$@"
