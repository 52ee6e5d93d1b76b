#!/usr/bin/env bash
# Runs the rendezvous and store benchmarks, with PyTorch's TCPStore side by
# side in the same run, and prints a table with ctrun/TCPStore ratios.
# Raw results (JSON lines) go to bench/results/ (not committed).
#
#   bench/run.sh            full run (about 6 minutes; torchrun's agent-loss
#                           runs wait out their 30 s limit)
#   bench/run.sh --quick    fewer agents and shorter store runs
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${CTRUN_BUILD_DIR:-build}
scripts/build.sh >/dev/null
bench=$BUILD_DIR/bench/rdzv_bench
ctrund=$BUILD_DIR/rendezvous/ctrund
python=${PYTHON_EXEC:-/usr/bin/python3}

agents=(64 256 1024 4096)
seconds=3
if [ "${1:-}" = "--quick" ]; then agents=(64 1024); seconds=1; fi

mkdir -p bench/results
out=bench/results/$(date +%Y%m%d-%H%M%S).jsonl
runs=5
[ "${1:-}" = "--quick" ] && runs=3
"$python" bench/launcher_bench.py --ctrun "$BUILD_DIR/launcher/ctrun" \
  --runs "$runs" | tee "$out.launch"
"$python" bench/recovery_bench.py --ctrun "$BUILD_DIR/launcher/ctrun" \
  --runs "$runs" --give_up 30 | tee "$out.recovery"
tag() { sed "s/^{/{\"impl\":\"$1\",/"; }
{
  for n in "${agents[@]}"; do
    "$bench" rendezvous --ctrund "$ctrund" --agents "$n" | tag ctrun
  done
  for c in 1 8; do
    "$bench" store --ctrund "$ctrund" --clients "$c" --seconds "$seconds" | tag ctrun
    "$python" bench/tcpstore_bench.py store --clients "$c" --seconds "$seconds" | tag tcpstore
    "$BUILD_DIR/bench/grpc_floor" "$c" "$seconds" | tag floor
  done
  for w in 8 64; do
    "$bench" broadcast --ctrund "$ctrund" --waiters "$w" | tag ctrun
    "$python" bench/tcpstore_bench.py broadcast --waiters "$w" | tag tcpstore
  done
} | tee "$out"

"$python" - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\nrendezvous: N agents (8 workers each) against one ctrund")
print(f"{'agents':>7} {'all assigned':>13} {'daemon CPU':>11} {'daemon RSS':>11}")
for r in rows:
    if r["bench"] == "rendezvous":
        print(f"{r['agents']:>7} {r['all_assigned_ms']:>10.1f} ms {r['daemon_cpu_s']:>9.2f} s"
              f" {r['daemon_peak_rss_mib']:>7.0f} MiB")
def pick(impl, bench, **kw):
    for r in rows:
        if r["impl"] == impl and r["bench"] == bench and all(r[k] == v for k, v in kw.items()):
            return r
print("\nstore: blocking operations per second (each client its own connection)")
print(f"{'op':>4} {'clients':>7} {'ctrun':>9} {'TCPStore':>9} {'ctrun/TCPStore':>15} {'gRPC floor':>11}")
for op in ("get", "set"):
    for c in (1, 8):
        a, b = pick("ctrun", "store", op=op, clients=c), pick("tcpstore", "store", op=op, clients=c)
        f = pick("floor", "grpc_floor", op=op, clients=c)
        if a and b:
            floor = f"{f['ops_per_s']:>11.0f}" if f else f"{'':>11}"
            note = "  (TCPStore's set does not wait for a reply)" if op == "set" else ""
            print(f"{op:>4} {c:>7} {a['ops_per_s']:>9.0f} {b['ops_per_s']:>9.0f} "
                  f"{a['ops_per_s'] / b['ops_per_s']:>14.2f}x {floor}{note}")
print("\nbroadcast: one set wakes N waiting gets (median of 5)")
print(f"{'waiters':>7} {'ctrun':>9} {'TCPStore':>9} {'TCPStore/ctrun':>15}")
for w in (8, 64):
    a, b = pick("ctrun", "broadcast", waiters=w), pick("tcpstore", "broadcast", waiters=w)
    if a and b:
        print(f"{w:>7} {a['median_ms']:>6.2f} ms {b['median_ms']:>6.2f} ms "
              f"{b['median_ms'] / a['median_ms']:>14.2f}x")
PY
