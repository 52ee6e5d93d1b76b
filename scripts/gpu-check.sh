#!/usr/bin/env bash
# GPU checks, for a machine with NVIDIA GPUs: builds with NCCL, runs the
# [gpu] tests (NCCL all-reduce through ctrun, train --backend nccl on every
# visible GPU) and prints a short verdict. About 5 minutes on one GPU, most
# of it the build.
#
#   scripts/gpu-check.sh            build into build-gpu/ (needs the
#                                   Debian packages of scripts/setup.sh)
#   CTRUN_BUILD_DIR=DIR scripts/gpu-check.sh   reuse a build
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CTRUN_BUILD_DIR:-build-gpu}

verdict() { echo "gpu-check: $*"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
  verdict "FAILED: no NVIDIA GPU visible (nvidia-smi)"
  exit 1
fi
if [ ! -x "$BUILD_DIR/launcher/ctrun" ] || [ -z "${CTRUN_BUILD_DIR:-}" ]; then
  CTRUN_BUILD_DIR=$BUILD_DIR scripts/build.sh -DCTRUN_GPU_TESTS=ON \
    -DCTRUN_BUILD_BENCH=OFF || { verdict "FAILED: build"; exit 1; }
fi
if ! grep -q "CTRUN_WITH_NCCL" "$BUILD_DIR/compile_commands.json"; then
  verdict "FAILED: built without NCCL (CUDA/NCCL not found at /usr/local/cuda)"
  exit 1
fi

status=0
ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure --timeout 300 || status=1
echo "--- train --backend nccl on every visible GPU"
"$BUILD_DIR/launcher/ctrun" --standalone --nproc_per_node=gpu \
  "$BUILD_DIR/examples/train" --backend nccl --steps 300 || status=1
if [ "$status" = 0 ]; then
  verdict "PASSED: NCCL communicators and train --backend nccl on $(nvidia-smi -L | wc -l) GPU(s)"
else
  verdict "FAILED: see above"
fi
exit "$status"
