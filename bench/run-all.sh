#!/usr/bin/env bash
# Every benchmark, ctrun and torchrun (Debian's python3-torch) side by side
# in the same run, each figure the median and min-max of repeated runs;
# then BENCHMARKS.md's results and its plots (docs/benchmarks/*.png).
#
#   bench/run-all.sh           full run, about 12 minutes on 2 cores
#   bench/run-all.sh --quick   fewer sizes and repeats, under 5 minutes
#
# Raw results, one JSON object per line, stay in bench/results/STAMP/ (not
# committed). What each benchmark does: BENCHMARKS.md, "Method".
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: bench/run-all.sh [--quick]" >&2; exit 2 ;;
esac

scripts/setup.sh --bench
scripts/build.sh >/dev/null
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
bin=$BUILD_DIR/bench
ctrun=$BUILD_DIR/launcher/ctrun
ctrund=$BUILD_DIR/rendezvous/ctrund
python=${PYTHON_EXEC:-/usr/bin/python3}
# 16384 simulated agents hold 16384 connections on each side.
ulimit -n "$(ulimit -Hn)"

if [ $quick -eq 1 ]; then
  runs=3 give_up=10 nodes=2,4 store_runs=2 seconds=1 torch_give_up=20
  agents=(16 64 128 256 1024 4096)
  torch_agents=(16 64 128 256)
  waiters=(8 64)
  etcd_agents=(64 512) etcd_torch_agents=(64) failover_agents=(64)
else
  runs=5 give_up=30 nodes=2,4,8 store_runs=3 seconds=3 torch_give_up=60
  agents=(16 64 128 256 512 1024 4096 16384)
  torch_agents=(16 64 128 256 512 1024)
  waiters=(8 64 256)
  etcd_agents=(64 512 4096) etcd_torch_agents=(64 512 4096)
  failover_agents=(64 512)
fi

out=bench/results/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
echo "bench: results in $out"
tag() { sed "s/^{/{\"impl\":\"$1\",/"; }
step() { echo "bench: $*" >&2; }

step "launch and exit, N = 1 4 16 64"
"$python" bench/launcher_bench.py --ctrun "$ctrun" --floors "$bin/floors" \
  --runs "$runs" --nprocs 1,4,16,64 | grep '^{' >"$out/launch.jsonl"

step "multi-node start and recovery"
"$python" bench/recovery_bench.py --ctrun "$ctrun" --floor "$bin/floors" \
  --runs "$runs" --give_up "$give_up" --nodes "$nodes" |
  grep '^{' >"$out/recovery.jsonl"

step "a PyTorch job: from a failure to every rank stepping again"
"$python" bench/pytorch_recovery_bench.py --ctrun "$ctrun" --runs "$runs" \
  --give_up "$give_up" | grep '^{' >"$out/pytorch_recovery.jsonl"

step "loopback round trip"
"$bin/floors" rtt >"$out/rtt.jsonl"

step "rendezvous scale: ${agents[*]} agents against ctrund"
for n in "${agents[@]}"; do
  reps=$runs
  [ "$n" -ge 16384 ] && reps=3  # each takes about 15 s
  for _ in $(seq "$reps"); do
    "$bin/rdzv_bench" rendezvous --ctrund "$ctrund" --agents "$n" | tag ctrun
  done
  # A bare gRPC server's memory for as many connections (a thread each).
  if [ "$n" -le 4096 ]; then "$bin/grpc_floor" "$n" 1 | tag floor; fi
done >"$out/rendezvous.jsonl"

step "rendezvous scale: torchrun's c10d, as far as it gets in ${torch_give_up} s"
for n in "${torch_agents[@]}"; do
  reps=$runs
  [ "$n" -ge 256 ] && reps=1  # tens of seconds each
  gave_up=0
  for _ in $(seq "$reps"); do
    line=$("$python" bench/torch_rdzv_bench.py --agents "$n" \
      --give_up "$torch_give_up" 2>/dev/null)
    echo "$line"
    case "$line" in *'"gave_up": true'*) gave_up=1; break ;; esac
  done
  [ $gave_up -eq 1 ] && break
done >>"$out/rendezvous.jsonl"

step "store: get and set with 1 and 8 clients; broadcast to ${waiters[*]} waiters"
{
  for _ in $(seq "$store_runs"); do
    for c in 1 8; do
      "$bin/rdzv_bench" store --ctrund "$ctrund" --clients "$c" \
        --seconds "$seconds" | tag ctrun
      "$python" bench/tcpstore_bench.py store --clients "$c" \
        --seconds "$seconds" | tag tcpstore
      "$bin/grpc_floor" "$c" "$seconds" | tag floor
    done
  done
  # Each broadcast run repeats itself 5 times and reports median, min, max.
  for w in "${waiters[@]}"; do
    "$bin/rdzv_bench" broadcast --ctrund "$ctrund" --waiters "$w" | tag ctrun
    "$python" bench/tcpstore_bench.py broadcast --waiters "$w" | tag tcpstore
  done
} >"$out/store.jsonl"

step "store durability: sets with each --fsync policy, 1 and 8 clients"
{
  for _ in $(seq "$store_runs"); do
    for c in 1 8; do
      "$bin/rdzv_bench" fsync --ctrund "$ctrund" --clients "$c" \
        --seconds "$seconds" --state-dir "$out/fsync-state" | tag ctrun
    done
  done
} >"$out/fsync.jsonl"

step "ctrund on etcd: rendezvous ${etcd_agents[*]}, sets, failover; torchrun etcd-v2"
etcd_dir=$(mktemp -d)
trap 'bench/etcd3.sh stop "$etcd_dir"; rm -rf "$etcd_dir"' EXIT
etcd=$(bench/etcd3.sh start "$etcd_dir")
{
  as() { sed "s/\"bench\": *\"$1\"/\"bench\":\"$2\"/"; }
  for n in "${etcd_agents[@]}"; do
    for _ in $(seq "$store_runs"); do
      "$bin/rdzv_bench" rendezvous --ctrund "$ctrund" --agents "$n" |
        tag ctrun | as rendezvous etcd-rendezvous
      "$bin/rdzv_bench" rendezvous --ctrund "$ctrund" --agents "$n" \
        --etcd "$etcd" | tag ctrun-etcd | as rendezvous etcd-rendezvous
    done
  done
  for n in "${etcd_torch_agents[@]}"; do
    line=$("$python" bench/torch_rdzv_bench.py --agents "$n" \
      --give_up "$torch_give_up" --etcd "${etcd%%,*}" 2>/dev/null)
    echo "$line" | as rendezvous etcd-rendezvous
    case "$line" in *'"gave_up": true'*) break ;; esac
  done
  for c in 1 8; do
    "$bin/rdzv_bench" store --ctrund "$ctrund" --clients "$c" \
      --seconds "$seconds" | tag ctrun | as store etcd-store
    "$bin/rdzv_bench" store --ctrund "$ctrund" --clients "$c" \
      --seconds "$seconds" --etcd "$etcd" | tag ctrun-etcd | as store etcd-store
    "$bin/rdzv_bench" etcd-floor --clients "$c" --seconds "$seconds" \
      --etcd "$etcd" | tag etcd | as store etcd-store
  done
  for n in "${failover_agents[@]}"; do
    for _ in $(seq "$store_runs"); do
      "$bin/rdzv_bench" failover --ctrund "$ctrund" --agents "$n" \
        --etcd "$etcd" | tag ctrun
    done
  done
} >"$out/etcd.jsonl"

step "hangs: a hung rank to a stopped job, N = 4 16; a heartbeat's cost"
{
  "$python" bench/hang_bench.py --ctrun "$ctrun" --runs "$runs" \
    --nprocs 4,16 | grep '^{'
  "$bin/heartbeat_bench"
  "$python" bench/heartbeat_bench.py
} >"$out/hang.jsonl"

step "report"
"$python" bench/report.py "$out" --markdown BENCHMARKS.md \
  --plots docs/benchmarks $([ $quick -eq 1 ] && echo --quick)
echo "bench: BENCHMARKS.md and docs/benchmarks/*.png updated from $out"
