#!/usr/bin/env bash
# Builds, on this (CPU) machine, everything scripts/gpu-check.sh runs on a
# GPU machine that has CUDA and PyTorch but none of our development
# packages: ctrun, the GPU tests and the programs they start, with NCCL
# support, and the shared libraries they need beside them.
#
#   scripts/gpu-bundle.sh [BUNDLE]     default: gpu-bundle/ (git-ignored)
#
# BUNDLE/bin holds the programs, whose RPATH ($ORIGIN/../lib) finds
# BUNDLE/lib. Left out on purpose: the C and C++ runtimes (the GPU
# machine's own are newer, and PyTorch needs them), the CUDA driver, and
# NCCL, which gpu-check.sh takes from the machine's PyTorch. The bundle must
# stay under 60 MiB: it travels with the working tree (64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-gpu-bundle}
BUILD_DIR=${CTRUN_BUILD_DIR:-build-gpu-bundle}
fail() { echo "gpu-bundle: $*" >&2; exit 1; }

scripts/setup.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCTRUN_GPU_TESTS=ON -DCTRUN_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags \
  -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--disable-new-dtags >/dev/null
grep -q CTRUN_WITH_NCCL "$BUILD_DIR/compile_commands.json" ||
  fail "CUDA and NCCL were not found under /usr/local/cuda: a bundle without NCCL would check nothing"
cmake --build "$BUILD_DIR" --target ctrun worker_probe train gpu_tests

programs=("$BUILD_DIR/launcher/ctrun" "$BUILD_DIR/tests/worker_probe"
          "$BUILD_DIR/examples/train" "$BUILD_DIR/tests/gpu_tests")
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
cp "${programs[@]}" "$BUNDLE/bin/"
cp "$BUILD_DIR/worker_lib/libctrun_worker.so" "$BUNDLE/lib/"
# What the loader resolves for each program (DT_RPATH applies to the
# libraries' own needs too), minus what the GPU machine brings itself.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libnccl|libctrun_worker)\.'
# (The bundled copies: the build tree's RPATH points at a lib/ it lacks.)
for program in "$BUNDLE"/bin/* "$BUNDLE/lib/libctrun_worker.so"; do
  ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    while read -r name path; do
      [[ $name =~ $skip ]] || cp -L -n "$path" "$BUNDLE/lib/$name"
    done
done
strip --strip-unneeded "$BUNDLE"/bin/* "$BUNDLE"/lib/*
git rev-parse HEAD > "$BUNDLE/REVISION" 2>/dev/null || echo unknown > "$BUNDLE/REVISION"

size=$(du -sb "$BUNDLE" | cut -f1)
[ "$size" -le $((60 << 20)) ] ||
  fail "$BUNDLE is $((size >> 20)) MiB; it must stay under 60 MiB to travel"
# A program that cannot find a library here will not there either.
missing=$(for p in "$BUNDLE"/bin/*; do
  ldd "$p" | grep "not found" | grep -v -E "libnccl|libcuda\.so" || true
done)
[ -z "$missing" ] || fail "unresolved libraries: $missing"
echo "gpu-bundle: $BUNDLE ($((size >> 20)) MiB, revision $(cat "$BUNDLE/REVISION"))"
