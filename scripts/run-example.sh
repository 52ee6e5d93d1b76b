#!/usr/bin/env bash
# The main job, end to end on this machine: set up, build, and run `train`
# (examples/train.cc, data-parallel SGD on libctrun_worker) with 4 workers
# under ctrun, the rendezvous hosted in-process, all-reducing with Gloo on
# the CPU. Every rank ends with the same parameter checksum.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
exec "$BUILD_DIR/launcher/ctrun" --standalone --nproc_per_node=4 \
  "$BUILD_DIR/examples/train" --backend gloo --steps 300
