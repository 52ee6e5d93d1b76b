#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs each for a bounded time from its
# corpus in fuzz/corpus/. A crash, a sanitizer report, a leak or a hang
# fails the run and leaves the input under $BUILD_DIR/fuzz-findings/.
#
#   scripts/fuzz.sh [--seconds N]     N seconds per target (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=30
case "${1:-}" in
  --seconds) seconds=${2:?--seconds needs a number} ;;
  --seconds=*) seconds=${1#--seconds=} ;;
  "") ;;
  *) echo "usage: scripts/fuzz.sh [--seconds N]" >&2; exit 2 ;;
esac
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --seconds $seconds: expected a whole number" >&2; exit 2; }

scripts/setup.sh --fuzz
BUILD_DIR=${CTRUN_FUZZ_BUILD_DIR:-build-fuzz}
targets=(hostlist_fuzzer command_line_fuzzer rendezvous_fuzzer progress_fuzzer)
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCTRUN_FUZZ=ON \
  -DCTRUN_SANITIZE=address,undefined \
  -DCTRUN_BUILD_TESTS=OFF -DCTRUN_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD_DIR" --target "${targets[@]}"

findings=$BUILD_DIR/fuzz-findings
rm -rf "$findings" && mkdir -p "$findings"
for target in "${targets[@]}"; do
  name=${target%_fuzzer}
  # New inputs go to a scratch directory: the corpus in the repo is read.
  scratch=$(mktemp -d)
  echo "fuzz: $name for ${seconds}s"
  if ! "$BUILD_DIR/fuzz/$target" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$findings/$name-" "$scratch" "fuzz/corpus/$name" \
      >"$findings/$name.log" 2>&1; then
    tail -40 "$findings/$name.log"
    echo "fuzz: $name failed; the input is in $findings/"
    rm -rf "$scratch"
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$findings/$name.log" | tail -1
  rm -rf "$scratch"
done
echo "fuzz: all targets ran ${seconds}s without a finding"
