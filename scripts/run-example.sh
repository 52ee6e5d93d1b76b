#!/usr/bin/env bash
# The main job, end to end on this machine: set up, build, and run a
# 4-worker PyTorch DDP training (Gloo, CPU) under ctrun, with the
# rendezvous hosted in-process (--standalone).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
# Debian's python3 has python3-torch; a python3 earlier in PATH may not.
export PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3}
exec "$BUILD_DIR/launcher/ctrun" --standalone --nproc_per_node=4 \
  examples/ddp_train.py --steps 200
