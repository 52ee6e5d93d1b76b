#!/usr/bin/env bash
# GPU checks, for a machine with NVIDIA GPUs, CUDA and PyTorch (with its
# pip NCCL). Runs from the bundle that scripts/gpu-bundle.sh built on a CPU
# machine; builds nothing, installs nothing. Every launch has a timeout;
# the whole check takes about 3 minutes on one GPU.
#
#   scripts/gpu-check.sh LOG_DIR [BUNDLE]     BUNDLE: default gpu-bundle/
#
# Prints one PASS/FAIL line per check with the figure seen, then a verdict;
# LOG_DIR gets summary.txt and each launch's output. With N GPUs the checks
# run N ranks. Exit status 0 only when every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
[ $# -ge 1 ] || { echo "usage: scripts/gpu-check.sh LOG_DIR [BUNDLE]" >&2; exit 2; }
mkdir -p "$1" && LOG=$(cd "$1" && pwd)
BUNDLE=$(cd "${2:-gpu-bundle}" 2>/dev/null && pwd) ||
  { echo "gpu-check: no bundle at ${2:-gpu-bundle}; build it with scripts/gpu-bundle.sh" >&2; exit 2; }
BIN=$BUNDLE/bin
PYTHON=${PYTHON:-python3}
: > "$LOG/summary.txt"
passed=0
failed=0

say() { echo "$*" | tee -a "$LOG/summary.txt"; }
result() {  # PASS|FAIL NAME FIGURE
  say "$1 $2: $3"
  if [ "$1" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
# launch NAME SECONDS COMMAND...: output in $LOG/NAME.log, exit status in
# $rc, seconds taken in $took.
launch() {
  local name=$1 seconds=$2 start tenths
  shift 2
  start=$(date +%s%N)
  timeout --kill-after=10 "$seconds" "$@" > "$LOG/$name.log" 2>&1
  rc=$?
  tenths=$((($(date +%s%N) - start) / 100000000))
  took=$((tenths / 10)).$((tenths % 10))
}
CTRUN=("$BIN/ctrun" --standalone)
# The value of KEY=... on the line of $LOG/NAME.log matching PATTERN.
field() { grep -E "$2" "$LOG/$1.log" | head -1 | grep -oE "$3=[^ ]+" | cut -d= -f2; }

if ! nvidia-smi -L > "$LOG/gpus.txt" 2>&1; then
  say "gpu-check: FAILED: no NVIDIA GPU visible (nvidia-smi -L)"
  exit 1
fi
GPUS=$(grep -c '^GPU ' "$LOG/gpus.txt")
# NCCL: the machine's own, from its PyTorch (the bundle leaves it out).
NCCL_LIB=$("$PYTHON" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null)
if [ -z "$NCCL_LIB" ] || [ ! -e "$NCCL_LIB/libnccl.so.2" ]; then
  say "gpu-check: FAILED: no libnccl.so.2 in $PYTHON's nvidia-nccl package"
  exit 1
fi
export LD_LIBRARY_PATH="$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHON_EXEC=$(command -v "$PYTHON")
say "gpu-check: $(date -u +%Y-%m-%dT%H:%MZ), $(sed -n 1p "$LOG/gpus.txt" | cut -d'(' -f1)x$GPUS, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
say "gpu-check: $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1), bundle $(cat "$BUNDLE/REVISION")"
SUM=$((GPUS * (GPUS + 1) / 2))

# 1. The NCCL all-reduce, each rank on the GPU its LOCAL_RANK names.
launch allreduce 60 "${CTRUN[@]}" --nproc_per_node="$GPUS" "$BIN/worker_probe" nccl
ok=$(grep -cE "^.*ok nccl rank=([0-9]+) device=\1 sum=$SUM$" "$LOG/allreduce.log")
if [ "$rc" = 0 ] && [ "$ok" = "$GPUS" ]; then
  result PASS allreduce "$GPUS rank(s), each on its LOCAL_RANK's GPU, sum=$SUM in ${took}s"
else
  result FAIL allreduce "exit $rc, $ok of $GPUS ranks right (want sum=$SUM on device=LOCAL_RANK)"
fi

# Two agents whose ranks share GPU 0: NCCL <= 2.29 refuses ("Duplicate GPU
# detected"); one that allows it with NCCL_MULTI_RANK_GPU_ENABLE=1 must sum.
port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s)
for node in 0 1; do
  CUDA_VISIBLE_DEVICES=0 NCCL_MULTI_RANK_GPU_ENABLE=1 timeout --kill-after=10 60 \
    "$BIN/ctrun" --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d \
    --rdzv_endpoint="127.0.0.1:$port" --rdzv_id=shared-gpu \
    --local_addr="127.0.0.$((node + 1))" \
    "$BIN/worker_probe" nccl > "$LOG/shared-gpu-$node.log" 2>&1 &
done
wait
took=$(($(date +%s) - start))
cat "$LOG"/shared-gpu-*.log > "$LOG/shared-gpu.log"
if grep -q "Duplicate GPU detected" "$LOG/shared-gpu.log" && [ "$took" -lt 60 ]; then
  result PASS shared-gpu "two agents on GPU 0 refused by NCCL with 'Duplicate GPU detected' in ${took}s"
elif [ "$(grep -c 'ok nccl rank=[01] device=0 sum=3$' "$LOG/shared-gpu.log")" = 2 ]; then
  result PASS shared-gpu "two agents on GPU 0 allowed (NCCL_MULTI_RANK_GPU_ENABLE=1), sum=3 in ${took}s"
else
  result FAIL shared-gpu "neither a clear refusal nor sum=3 within 60 s (took ${took}s)"
fi

# 2. train converges with NCCL; with one rank, bit for bit as with Gloo.
launch train-nccl 120 "${CTRUN[@]}" --nproc_per_node="$GPUS" "$BIN/train" --backend nccl --steps 300
nccl_sha=$(field train-nccl "final step=300" params_sha256)
loss=$(field train-nccl "final step=300" loss)
shas=$(grep -oE "params_sha256=[0-9a-f]+" "$LOG/train-nccl.log" | sort -u | wc -l)
launch train-gloo 120 "${CTRUN[@]}" --nproc_per_node="$GPUS" "$BIN/train" --backend gloo --steps 300
gloo_sha=$(field train-gloo "final step=300" params_sha256)
gloo_loss=$(field train-gloo "final step=300" loss)
if [ -n "$nccl_sha" ] && [ "$shas" = 1 ] && [ "$GPUS" = 1 ] && [ "$nccl_sha" = "$gloo_sha" ]; then
  result PASS train-nccl "loss=$loss, params equal to Gloo's bit for bit (${nccl_sha:0:12})"
elif [ -n "$nccl_sha" ] && [ "$shas" = 1 ] && [ "$GPUS" -gt 1 ] && [ "$loss" = "$gloo_loss" ]; then
  result PASS train-nccl "$GPUS ranks agree, loss=$loss as with Gloo"
else
  result FAIL train-nccl "loss=${loss:-none} (Gloo ${gloo_loss:-none}), ${shas} distinct params across ranks, nccl ${nccl_sha:0:12} gloo ${gloo_sha:0:12}"
fi

# 3. A rank killed mid-run: restart, resume, same parameters.
rm -rf "$LOG/checkpoint"
launch train-crash 180 "${CTRUN[@]}" --nproc_per_node="$GPUS" --max_restarts=1 "$BIN/train" \
  --backend nccl --steps 300 --checkpoint_dir "$LOG/checkpoint" \
  --crash_at_step 170 --crash_rank $((GPUS - 1))
crash_sha=$(field train-crash "final step=300" params_sha256)
if [ "$rc" = 0 ] && grep -q "resuming from step 160" "$LOG/train-crash.log" &&
   [ -n "$crash_sha" ] && [ "$crash_sha" = "$nccl_sha" ]; then
  result PASS train-crash "rank $((GPUS - 1)) killed at step 170, resumed from 160, same params (${crash_sha:0:12}) in ${took}s"
else
  result FAIL train-crash "exit $rc, params ${crash_sha:-none} vs ${nccl_sha:-none}"
fi

# 4. Two workers, one visible GPU: a clear LOCAL_RANK refusal, not a hang.
CUDA_VISIBLE_DEVICES=0 launch one-visible 60 "${CTRUN[@]}" --nproc_per_node=2 "$BIN/worker_probe" nccl
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "LOCAL_RANK" "$LOG/one-visible.log"; then
  result PASS one-visible "refused in ${took}s: $(grep -o 'LOCAL_RANK=[^;]*' "$LOG/one-visible.log" | head -1)"
else
  result FAIL one-visible "exit $rc after ${took}s, no LOCAL_RANK message"
fi

# 4b. In-process recovery on NCCL: a rank killed, the others keep their
# processes and form a new communicator (needs two GPUs).
if [ "$GPUS" -ge 2 ]; then
  launch resilient-nccl 120 "${CTRUN[@]}" --nproc_per_node="$GPUS" --max_restarts=1 \
    --recovery=inprocess "$BIN/worker_probe" resilient-nccl 40
  ok=$(grep -c "ok resilient-nccl" "$LOG/resilient-nccl.log")
  if [ "$rc" = 0 ] && [ "$ok" = "$GPUS" ] && grep -q "kept their processes\|kept its process" "$LOG/resilient-nccl.log"; then
    result PASS resilient-nccl "$(grep -o 'round 1 recovered in [0-9.]*s' "$LOG/resilient-nccl.log")"
  else
    result FAIL resilient-nccl "exit $rc, $ok of $GPUS ranks finished"
  fi
fi

# 5. The users' own scripts under ctrun, and the environment they see.
for script in ddp_nccl accelerate_check trainer_check; do
  launch "$script" 180 "${CTRUN[@]}" --nproc_per_node=gpu "$ROOT/tests/gpu/$script.py"
  line=$(grep -oE "ok [a-z]+ ranks=[0-9]+ agree=[a-z]+ .*" "$LOG/$script.log" | head -1)
  if [ "$rc" = 0 ] && [[ $line == *"ranks=$GPUS agree=yes"* ]]; then
    result PASS "$script" "${line#ok } in ${took}s"
  else
    result FAIL "$script" "exit $rc: ${line:-$(tail -1 "$LOG/$script.log")}"
  fi
done
base_keys=$(env | cut -d= -f1 | paste -sd,),PYTHON_EXEC
for launcher in torchrun ctrun; do
  rm -rf "$LOG/env-$launcher"
  mkdir -p "$LOG/env-$launcher"
  if [ $launcher = torchrun ]; then
    cmd=("$PYTHON" -m torch.distributed.run --standalone)
  else
    cmd=("${CTRUN[@]}")
  fi
  DUMP_DIR=$LOG/env-$launcher BASE_ENV_KEYS=$base_keys \
    launch "env-$launcher" 120 "${cmd[@]}" --nproc_per_node=gpu "$ROOT/tests/e2e/env_dump.py"
done
if "$PYTHON" "$ROOT/tests/e2e/env_diff.py" "$LOG/env-torchrun" "$LOG/env-ctrun" > "$LOG/env-diff.log" 2>&1; then
  result PASS env-vs-torchrun "$(tail -1 "$LOG/env-diff.log")"
else
  result FAIL env-vs-torchrun "$(tail -1 "$LOG/env-diff.log"); see env-diff.log"
fi
sed 's/^/  /' "$LOG/env-diff.log" | tee -a "$LOG/summary.txt"

# NUMA binding and the GPU watch on the real machine.
launch numa 60 "${CTRUN[@]}" --nproc_per_node="$GPUS" --numa_binding=node /bin/sh -c \
  'grep Cpus_allowed_list /proc/$$/status'
if [ "$rc" = 0 ]; then
  result PASS numa-node "$(grep -o 'local rank 0 on CPUs .*' "$LOG/numa.log"); rank 0 $(grep -m1 -oE '0\]: Cpus_allowed_list:.*' "$LOG/numa.log" | tr '\t' ' ')"
else
  result FAIL numa-node "exit $rc: $(grep -m1 'ctrun:' "$LOG/numa.log")"
fi
launch usage 120 "${CTRUN[@]}" --nproc_per_node="$GPUS" "$PYTHON" -c \
  'import os, time, torch; x = torch.ones(256 << 20, device="cuda"); [x.mul_(1.0001) for _ in range(20000)]; torch.cuda.synchronize()'
line=$(grep -m1 -oE "ctrun: rank 0: .*GPU 0: peak memory.*" "$LOG/usage.log")
if [ "$rc" = 0 ] && [ -n "$line" ]; then
  result PASS end-of-job "${line#ctrun: }"
else
  result FAIL end-of-job "exit $rc, no GPU usage in rank 0's end-of-job line"
fi
if [ "$GPUS" -gt 1 ]; then
  # Every rank on GPU 0: the mistake the warning exists for.
  launch crowded 120 "${CTRUN[@]}" --nproc_per_node="$GPUS" "$PYTHON" -c \
    'import time, torch; x = torch.ones(1 << 20, device="cuda:0"); time.sleep(10)'
  if grep -q "all run on GPU 0; GPU" "$LOG/crowded.log"; then
    result PASS only-gpu-0 "$(grep -m1 -o 'ranks .*idle' "$LOG/crowded.log")"
  else
    result FAIL only-gpu-0 "no warning for $GPUS ranks on GPU 0"
  fi
fi

# The [gpu] Catch tests, through ctest: a bundle without them cannot pass.
mkdir -p "$LOG/ctest"
{
  "$BIN/gpu_tests" --list-test-names-only "[gpu]" | sed '/^$/d' |
    while IFS= read -r name; do
      echo "add_test(\"gpu:$name\" \"$BIN/gpu_tests\" \"$name\")"
      echo "set_tests_properties(\"gpu:$name\" PROPERTIES LABELS gpu ENVIRONMENT \"CTRUN_TEST_BIN_DIR=$BIN;CTRUN_TEST_SOURCE_DIR=$ROOT\")"
    done
} > "$LOG/ctest/CTestTestfile.cmake"
launch ctest 300 ctest --test-dir "$LOG/ctest" -L gpu --no-tests=error --timeout 120 --output-on-failure
if [ "$rc" = 0 ]; then
  result PASS ctest-gpu "$(grep -oE '[0-9]+% tests passed.*' "$LOG/ctest.log")"
else
  result FAIL ctest-gpu "$(grep -oE '[0-9]+% tests passed.*|No tests were found.*' "$LOG/ctest.log" | head -1)"
fi

if [ "$failed" = 0 ]; then
  say "gpu-check: PASSED $passed checks on $GPUS GPU(s)"
else
  say "gpu-check: FAILED $failed of $((passed + failed)) checks; logs in $LOG"
fi
[ "$failed" = 0 ]
