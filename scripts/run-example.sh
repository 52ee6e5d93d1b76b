#!/usr/bin/env bash
# The main job, end to end on this machine: set up, build, and run it.
#
# Today (before the `ctrun` launcher lands) the job is a rendezvous: a
# ctrund daemon on loopback and four simulated agents of 8 workers each,
# which get their group ranks, global ranks and master address from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
"$BUILD_DIR/bench/rdzv_bench" demo --ctrund "$BUILD_DIR/rendezvous/ctrund" --agents 4
