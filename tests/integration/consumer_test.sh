#!/usr/bin/env bash
# Installs ctrun into a temporary prefix, builds tests/consumer against it
# with find_package(ctrun), and runs the consumer under the installed ctrun.
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$source_dir/tests/consumer" -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
# Outside a launch it explains itself...
set +e
"$work/build/consumer"
code=$?
set -e
[ "$code" = 3 ] || { echo "expected exit 3 outside ctrun, got $code"; exit 1; }
# ...and under the installed ctrun it knows its rank.
out=$("$work/prefix/bin/ctrun" --nproc_per_node=2 \
  --log_line_prefix_template= "$work/build/consumer")
echo "$out"
[ "$(echo "$out" | grep -c 'consumer: rank [01] of 2')" = 2 ]
echo "consumer test passed"
