#!/usr/bin/python3
"""Turns a bench/run-all.sh results directory into BENCHMARKS.md's results
(the part between its RESULTS markers) and the plots it shows.

    report.py RESULTS_DIR --markdown BENCHMARKS.md --plots docs/benchmarks
              [--quick]

Every figure is the median and min-max over the run's repetitions; ratios
are of medians. Plots are drawn by gnuplot (pngcairo).
"""
import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import tempfile

BEGIN = "<!-- BEGIN RESULTS: written by bench/report.py -->"
END = "<!-- END RESULTS -->"


def load(results_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*.jsonl"))):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.startswith("{")]
    return rows


def spread(values):
    """(median, min, max) of the values that are not None, or None."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def ms(s, scale=1000.0, digits=None):
    """"12.3 ms (11-14)" from a (median, min, max) in seconds."""
    if s is None:
        return "—"
    med, lo, hi = (x * scale for x in s[:3])
    d = digits if digits is not None else (1 if med < 100 else 0)
    return f"{med:.{d}f} ms ({lo:.{d}f}–{hi:.{d}f})"


def ratio(a, b):
    """b/a of two spreads' medians, as "12×"."""
    if a is None or b is None or not a[0]:
        return "—"
    r = b[0] / a[0]
    return f"{r:.0f}×" if r >= 10 else f"{r:.1f}×"


def command(*argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def package_version(pattern):
    out = command("dpkg-query", "-W", "-f", "${Package} ${Version}\\n",
                  pattern)
    return out.splitlines()[0].split()[1] if out != "?" and out else "?"


def machine():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_gib = int(f.readline().split()[1]) / 2**20
    with open("/etc/debian_version") as f:
        debian = f.read().strip()
    commit = command("git", "rev-parse", "--short", "HEAD")
    return (f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB; Debian "
            f"{debian}, Linux {platform.release()}; gRPC "
            f"{package_version('libgrpc++1*')}, PyTorch "
            f"{package_version('python3-torch')}, gcc "
            f"{package_version('gcc-12')}; ctrun {commit}")


class Report:
    def __init__(self, rows):
        self.rows = rows
        self.md = []
        self.plots = []  # (name, gnuplot script with $DATA blocks)

    def pick(self, **match):
        return [r for r in self.rows
                if all(r.get(k) == v for k, v in match.items())]

    def out(self, *lines):
        self.md.extend(lines)

    # --- launch -----------------------------------------------------------
    def launch(self):
        rows = sorted(self.pick(bench="launch"), key=lambda r: r["nproc"])
        if not rows:
            return
        self.out("### Launch and exit",
                 "",
                 "`--standalone --nproc_per_node=N --no_python true`, from "
                 "start to exit. The floor starts N `true` processes and "
                 "waits for them (`floors spawn N`).",
                 "",
                 "| N | ctrun | torchrun | torchrun / ctrun | floor | "
                 "ctrun RSS | torchrun RSS | torchrun / ctrun |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|")
        data = []
        for r in rows:
            c, t = r["ctrun"], r["torchrun"]
            f = r.get("floor", {}).get("wall_s")
            self.out(f"| {r['nproc']} | {ms(c['wall_s'])} | "
                     f"{ms(t['wall_s'], digits=0)} | "
                     f"{ratio(c['wall_s'], t['wall_s'])} | {ms(f)} | "
                     f"{c['rss_mib'][0]:.1f} MiB | {t['rss_mib'][0]:.0f} MiB | "
                     f"{ratio(c['rss_mib'], t['rss_mib'])} |")
            data.append((r["nproc"], c["wall_s"], t["wall_s"], f))
        self.out("", "![launch](docs/benchmarks/launch.png)", "")
        self.plots.append(("launch", line_plot(
            "Launch to exit, --standalone --no\\_python true",
            "workers per node (N)", "milliseconds", data,
            ["ctrun", "torchrun", "floor: spawn N processes"], logx=True)))

    # --- a real PyTorch job's recovery -------------------------------------
    def pytorch_recovery(self):
        rows = {r["bench"]: r for r in self.rows
                if r["bench"] in ("pytorch_worker_kill", "pytorch_node_kill",
                                  "pytorch_spare_kill")}
        if not rows:
            return

        def cell(s):
            if s is None:
                return "never"
            return ms([s["median"], s["min"], s["max"]], digits=0)

        def speedup(fast, slow):
            if fast is None or slow is None:
                return "—"
            return ratio([fast["median"]], [slow["median"]])

        self.out("### A PyTorch job: from a failure to every rank stepping "
                 "again",
                 "",
                 "`bench/pytorch_recovery_bench.py`: a Gloo job all-reducing "
                 "in a loop (`bench/recovery_job.py`), each rank logging every "
                 "finished step; the figure runs from the `kill -9` to the "
                 "slowest rank's first step after it. Worker: one node, 4 "
                 "ranks, rank 1 kills itself. Node: two nodes of 2 ranks "
                 "(`--nnodes=1:2`, ctrun's meeting at a ctrund), group rank "
                 "1's agent is killed. *kept*: ranks that stepped again in "
                 "the process they had; *warm*: new processes forked from "
                 "the template.",
                 "",
                 "| | torchrun | ctrun (restart) | ctrun `--preload=torch` | "
                 "ctrun `--recovery=inprocess` | torchrun / in-process |",
                 "|---|---:|---:|---:|---:|---:|")
        names = {"pytorch_worker_kill": "worker `kill -9`",
                 "pytorch_node_kill": "node (agent) `kill -9`"}
        for name in ("pytorch_worker_kill", "pytorch_node_kill"):
            if name not in rows:
                continue
            r = rows[name]
            parts = []
            for v in ("torchrun", "ctrun", "preload", "inprocess"):
                s = r.get(v)
                extra = (f"; kept {s['kept']}, warm {s['warm']}"
                         if s and (s["kept"] or s["warm"]) else "")
                parts.append(cell(s) + extra)
            self.out(f"| {names[name]} | " + " | ".join(parts) +
                     f" | {speedup(r['inprocess'], r['torchrun'])} |")
        self.out("")
        spare = rows.get("pytorch_spare_kill")
        if spare is None:
            return
        self.out("Hot spares (`--spares=1`): three nodes of one rank whose "
                 "imports take 2 s more than torch's; the last rank's agent "
                 "is killed. Cold: a new node started when the loss is seen, "
                 "as one would for torchrun; hot: a fourth agent waits as a "
                 "spare with torch and the slow module preloaded, and takes "
                 "the lost node's rank.",
                 "",
                 "| | torchrun, new node | ctrun, new node | ctrun, hot spare "
                 "| hot spare, `--recovery=inprocess` | cold / hot "
                 "in-process |",
                 "|---|---:|---:|---:|---:|---:|")
        parts = [cell(spare.get(v)) for v in
                 ("torchrun_cold", "ctrun_cold", "hot", "hot_inprocess")]
        self.out("| agent `kill -9` | " + " | ".join(parts) + " | " +
                 speedup(spare.get("hot_inprocess"), spare.get("ctrun_cold")) +
                 " |", "")

    # --- multi-node and recovery -----------------------------------------
    def recovery(self):
        rows = {r["bench"]: r for r in self.rows
                if r["bench"].startswith("nodes_")
                or r["bench"] in ("agent_kill", "worker_kill")}
        if not rows:
            return

        def cell(s):
            if s == "not started":
                return "did not start"
            if s is None:
                return "never"
            return ms(s, digits=0)

        self.out("### Multi-node start and recovery",
                 "",
                 "Agents on one machine standing for nodes, the rendezvous "
                 "hosted by one of them. The floor starts the processes the "
                 "step needs (`floors spawn`: two per node; the two "
                 "survivors' workers; the four workers).",
                 "",
                 "| | ctrun | torchrun | torchrun / ctrun | floor |",
                 "|---|---:|---:|---:|---:|")
        names = {"agent_kill": "agent `kill -9` → survivors running the next "
                               "round",
                 "worker_kill": "worker `kill -9` → all 4 workers running "
                                "again"}
        data = []
        for name in sorted(k for k in rows if k.startswith("nodes_")) + [
                "agent_kill", "worker_kill"]:
            if name not in rows:
                continue
            r = rows[name]
            c, t = r["ctrun"], r["torchrun"]
            label = names.get(name, f"{name[6:]}-node start to exit")
            numeric = all(isinstance(x, list) for x in (c, t))
            self.out(f"| {label} | {cell(c)} | {cell(t)} | "
                     f"{ratio(c, t) if numeric else '—'} | "
                     f"{ms(r.get('floor'), digits=1)} |")
            if name.startswith("nodes_"):
                data.append((int(name[6:]), c if numeric else None,
                             t if numeric else None, r.get("floor")))
        self.out("", "“never”: not within the run's give-up time (see "
                 "`bench/run-all.sh`).", "",
                 "![multi-node](docs/benchmarks/multinode.png)", "")
        self.plots.append(("multinode", line_plot(
            "Multi-node start to exit (one worker per node)", "nodes",
            "milliseconds", sorted(data),
            ["ctrun", "torchrun", "floor: spawn the processes"], logx=True)))

    # --- rendezvous scale --------------------------------------------------
    def rendezvous(self):
        rtt = self.pick(bench="rtt")
        rtt_us = rtt[0]["median_us"] if rtt else None
        by = {}
        for r in self.pick(bench="rendezvous"):
            by.setdefault((r["impl"], r["agents"]), []).append(r)
        if not by:
            return
        sizes = sorted({n for _, n in by})

        def field(impl, n, key):
            runs = by.get((impl, n), [])
            return spread([r.get(key) for r in runs if not r.get("gave_up")])

        def grpc_rss(n):
            v = spread([r.get("server_peak_rss_mib") for r in
                        self.pick(bench="grpc_floor", clients=n)])
            return f"{v[0]:.0f} MiB" if v else "—"

        floor_note = (f" The floor is N loopback round trips one after "
                      f"another (one round trip: {rtt_us:.0f} µs median)."
                      if rtt_us else "")
        self.out("### Rendezvous scale",
                 "",
                 "N simulated agents (8 workers each) join one job against "
                 "ctrund, and against torchrun's c10d rendezvous "
                 "(`DynamicRendezvousHandler` over a `TCPStore` in its own "
                 "process). Time from the first join to the last assignment; "
                 "CPU seconds and peak RSS of the daemon (ctrund) or the "
                 "store process (torchrun)." + floor_note + " gRPC RSS: "
                 "a bare gRPC server (`grpc_floor`) holding as many "
                 "connections and streams, each answered once: gRPC's own "
                 "memory, the floor of ctrund's.",
                 "",
                 "| agents | ctrun | torchrun | torchrun / ctrun | floor | "
                 "ctrund CPU | store CPU | ctrund RSS | gRPC RSS | "
                 "store RSS |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        data = []
        for n in sizes:
            c = field("ctrun", n, "all_assigned_ms")
            t = field("torchrun", n, "all_assigned_ms")
            gave_up = any(r.get("gave_up")
                          for r in by.get(("torchrun", n), []))
            floor = (n * rtt_us / 1000.0,) * 3 if rtt_us else None
            if gave_up:
                t_cell = "did not finish"
            elif t:
                t_cell = ms(t, scale=1, digits=0)
            else:
                t_cell = "not run"

            def amount(impl, key, unit, digits):
                v = field(impl, n, key)
                return f"{v[0]:.{digits}f} {unit}" if v else "—"

            self.out(" | ".join([
                f"| {n}", ms(c, scale=1), t_cell, ratio(c, t),
                ms(floor, scale=1),
                amount("ctrun", "daemon_cpu_s", "s", 2),
                amount("torchrun", "daemon_cpu_s", "s", 2),
                amount("ctrun", "daemon_peak_rss_mib", "MiB", 0),
                grpc_rss(n),
                amount("torchrun", "daemon_peak_rss_mib", "MiB", 0)]) + " |")
            data.append((n, c and tuple(x / 1000 for x in c),
                         t and tuple(x / 1000 for x in t),
                         floor and tuple(x / 1000 for x in floor)))
        self.out("", "“did not finish”: not all agents assigned within the "
                 "give-up time; larger sizes were not tried.", "",
                 "![rendezvous](docs/benchmarks/rendezvous.png)", "")
        self.plots.append(("rendezvous", line_plot(
            "Rendezvous: time until every agent is assigned", "agents",
            "milliseconds", data,
            ["ctrun (ctrund)", "torchrun (c10d over TCPStore)",
             "floor: N loopback round trips"], logx=True)))

    # --- store --------------------------------------------------------------
    def store(self):
        def ops(impl, bench, op, clients):
            return spread([r["ops_per_s"] for r in self.pick(
                impl=impl, bench=bench, op=op, clients=clients)])

        if not self.pick(bench="store"):
            return
        rtt = self.pick(bench="rtt")
        self.out("### Store",
                 "",
                 "Blocking operations per second, each client its own "
                 "connection. The gRPC floor is a gRPC server that answers "
                 "every request with a constant (`grpc_floor`); the "
                 "round-trip floor is one loopback round trip per operation "
                 "and client.",
                 "",
                 "| op | clients | ctrun | TCPStore | ctrun / TCPStore | "
                 "gRPC floor | round-trip floor |",
                 "|---|---:|---:|---:|---:|---:|---:|")
        bars = []
        for op in ("get", "set"):
            for c in (1, 8):
                a = ops("ctrun", "store", op, c)
                b = ops("tcpstore", "store", op, c)
                f = ops("floor", "grpc_floor", op, c)
                if not a or not b:
                    continue
                rt = (f"{1e6 / rtt[0]['median_us'] * c:,.0f}"
                      if rtt and c == 1 else "—")
                note = " (a)" if op == "set" else ""
                comparable = op == "get"
                self.out(f"| {op} | {c} | {a[0]:,.0f} ({a[1]:,.0f}–"
                         f"{a[2]:,.0f}) | {b[0]:,.0f}{note} | "
                         f"{f'{a[0] / b[0]:.2f}×' if comparable else '—'} | "
                         f"{f'{f[0]:,.0f}' if f else '—'} | {rt} |")
                if op == "get":
                    bars.append((f"get, {c} client{'s' if c > 1 else ''}",
                                 a[0], b[0], f[0] if f else 0))
        self.out("", "(a) TCPStore's `set` returns without waiting for a "
                 "reply: a different operation from ctrun's, which returns "
                 "once the value is stored and waiters are woken.", "")
        by_w = {}
        for r in self.pick(bench="broadcast"):
            by_w.setdefault((r["impl"], r["waiters"]), []).append(r)

        def broadcast(impl, w):
            """Each run reports median, min and max of its repetitions."""
            runs = by_w.get((impl, w), [])
            if not runs:
                return None
            return (statistics.median(r["median_ms"] for r in runs),
                    min(r["min_ms"] for r in runs),
                    max(r["max_ms"] for r in runs))

        if by_w:
            self.out("One `set` waking N waiting `get`s, each waiter its own "
                     "connection: time from the set to the last answer.",
                     "",
                     "| waiters | ctrun | TCPStore | TCPStore / ctrun |",
                     "|---:|---:|---:|---:|")
            data = []
            for w in sorted({w for _, w in by_w}):
                a = broadcast("ctrun", w)
                b = broadcast("tcpstore", w)
                self.out(f"| {w} | {ms(a, scale=1)} | {ms(b, scale=1)} | "
                         f"{ratio(a, b)} |")
                data.append((w, a and tuple(x / 1000 for x in a),
                             b and tuple(x / 1000 for x in b), None))
            self.plots.append(("broadcast", line_plot(
                "Broadcast: one set wakes N waiting gets", "waiters",
                "milliseconds", data, ["ctrun", "TCPStore"], logx=True)))
        self.out("", "![store](docs/benchmarks/store.png) "
                 "![broadcast](docs/benchmarks/broadcast.png)", "")
        self.plots.append(("store", bar_plot(
            "Store get: operations per second", bars,
            ["ctrun", "TCPStore", "gRPC floor"])))


    # --- store durability -----------------------------------------------------
    def durability(self):
        rows = self.pick(bench="fsync")
        if not rows:
            return
        self.out("### Store durability",
                 "",
                 "Blocking `set`s per second against ctrund without a state "
                 "directory and with `--state-dir` under each `--fsync` "
                 "policy; each client its own key and connection. `batch` "
                 "and `always` sync every change before answering it; "
                 "`batch` lets concurrent changes share one sync. TCPStore "
                 "keeps nothing on disk: its column is the in-memory store.",
                 "",
                 "| clients | no state dir | never | batch | always | "
                 "TCPStore set | batch / always |",
                 "|---:|---:|---:|---:|---:|---:|---:|")
        for c in sorted({r["clients"] for r in rows}):
            cell = {}
            for policy in ("none", "never", "batch", "always"):
                cell[policy] = spread([r["ops_per_s"] for r in self.pick(
                    bench="fsync", policy=policy, clients=c)])
            tcp = spread([r["ops_per_s"] for r in self.pick(
                impl="tcpstore", bench="store", op="set", clients=c)])

            def fmt(x):
                return f"{x[0]:,.0f}" if x else "—"
            gain = (f"{cell['batch'][0] / cell['always'][0]:.1f}×"
                    if cell["batch"] and cell["always"] else "—")
            self.out(f"| {c} | {fmt(cell['none'])} | {fmt(cell['never'])} | "
                     f"{fmt(cell['batch'])} | {fmt(cell['always'])} | "
                     f"{fmt(tcp)} | {gain} |")
        self.out("")

    # --- ctrund on etcd -------------------------------------------------------
    def availability(self):
        rows = self.pick(bench="etcd-rendezvous")
        if not rows:
            return
        self.out("### ctrund on etcd",
                 "",
                 "The same rendezvous (N simulated agents, one job of N "
                 "nodes) against ctrund alone, a ctrund replica keeping its "
                 "state in a 3-member etcd on this machine (`--etcd`), and "
                 "torchrun's `etcd-v2` backend on the same etcd. Time from "
                 "the first join to the last assignment; torchrun's sizes "
                 "stop at the first that does not finish within the give-up "
                 "time (60 s); a dash: not run.",
                 "",
                 "| agents | ctrund alone | ctrund on etcd | torchrun etcd-v2 "
                 "| etcd-v2 / ctrund on etcd |",
                 "|---:|---:|---:|---:|---:|")
        for n in sorted({r["agents"] for r in rows}):
            cell = {impl: spread([
                r["all_assigned_ms"] / 1000 if r.get("all_assigned_ms")
                else None
                for r in self.pick(bench="etcd-rendezvous", impl=impl,
                                   agents=n)])
                for impl in ("ctrun", "ctrun-etcd", "torchrun-etcd-v2")}
            torch = ms(cell["torchrun-etcd-v2"])
            if any(r.get("gave_up") for r in self.pick(
                    bench="etcd-rendezvous", impl="torchrun-etcd-v2",
                    agents=n)):
                torch = "gave up"
            self.out(f"| {n} | {ms(cell['ctrun'])} | {ms(cell['ctrun-etcd'])}"
                     f" | {torch} | "
                     f"{ratio(cell['ctrun-etcd'], cell['torchrun-etcd-v2'])} |")
        self.out("",
                 "Blocking `set`s per second (each client its own key and "
                 "connection): every change is in etcd before it is "
                 "answered. The floor: as many clients putting straight to "
                 "etcd, each waiting for its answer (`rdzv_bench "
                 "etcd-floor`); ctrund can pass it by gathering concurrent "
                 "sets into one etcd transaction.",
                 "",
                 "| clients | ctrund alone | ctrund on etcd | etcd puts "
                 "(floor) | on etcd / floor |",
                 "|---:|---:|---:|---:|---:|")
        for c in sorted({r["clients"] for r in self.pick(bench="etcd-store")}):
            cell = {impl: spread([r["ops_per_s"] for r in self.pick(
                bench="etcd-store", impl=impl, op=op, clients=c)])
                for impl, op in (("ctrun", "set"), ("ctrun-etcd", "set"),
                                 ("etcd", "etcd-put"))}

            def fmt(x):
                return f"{x[0]:,.0f}" if x else "—"
            over = (f"{cell['ctrun-etcd'][0] / cell['etcd'][0]:.2f}×"
                    if cell["ctrun-etcd"] and cell["etcd"] else "—")
            self.out(f"| {c} | {fmt(cell['ctrun'])} | "
                     f"{fmt(cell['ctrun-etcd'])} | {fmt(cell['etcd'])} | "
                     f"{over} |")
        self.out("",
                 "Leader killed (`kill -9`) under N agents: time until every "
                 "agent has resumed its session on the standby (lease TTL "
                 "2 s). torchrun has no counterpart: its c10d rendezvous "
                 "dies with the agent that hosts it, and etcd-v2 agents keep "
                 "no session to lose.",
                 "",
                 "| agents | all resumed |",
                 "|---:|---:|")
        for n in sorted({r["agents"] for r in self.pick(bench="failover")}):
            self.out(f"| {n} | " + ms(spread([
                r["all_resumed_ms"] / 1000
                for r in self.pick(bench="failover", agents=n)])) + " |")
        self.out("")

    # --- hangs ----------------------------------------------------------------
    def hangs(self):
        rows = self.pick(bench="hang")
        if rows:
            self.out("### From a hung rank to a stopped job",
                     "",
                     "Seconds from the moment one rank of N stops making "
                     "progress to every worker stopped and the launcher "
                     "gone (`--max_restarts=0`), hang timeout 2 s. ctrun "
                     "keeps every worker's Python and native stacks first "
                     "(and without them, `--hang_evidence_timeout=0`); "
                     "torchrun's nearest is its file timers (`expires()` "
                     "around each step), which keep nothing. Without them "
                     "torchrun waits for the collective's own timeout "
                     "(Gloo 30 min, NCCL 10 min).",
                     "",
                     "| N | ctrun, with stacks | ctrun, no evidence | "
                     "torchrun file timers |",
                     "|---:|---:|---:|---:|")
            for n in sorted({r["nproc"] for r in rows}):
                cells = [ms(spread([r["seconds"] for r in self.pick(
                    bench="hang", impl=impl, nproc=n)]), scale=1.0, digits=2)
                    .replace(" ms", " s")
                    for impl in ("ctrun", "ctrun-no-evidence",
                                 "torchrun-file-timer")]
                self.out(f"| {n} | " + " | ".join(cells) + " |")
            self.out("")
        beats = {r["impl"]: r for r in self.pick(bench="heartbeat")}
        if beats:
            self.out("### The cost of a progress signal", "",
                     "Per call, against a real board file; the clock read "
                     "each includes is the floor. torchrun's nearest, an "
                     "`expires()` (FileTimerClient acquire and release on "
                     "its FIFO), beside it.", "",
                     "| | heartbeat | section start and end | clock floor | "
                     "torchrun `expires()` |", "|---|---:|---:|---:|---:|")
            if (c := beats.get("ctrun-c++")):
                self.out(f"| C++ | {c['heartbeat_ns']:.0f} ns | "
                         f"{c['section_ns']:.0f} ns | "
                         f"{c['clock_floor_ns']:.0f} ns | — |")
            if (p := beats.get("ctrun-python")):
                timer = (f"{p['torch_file_timer_us']:.1f} µs"
                         if "torch_file_timer_us" in p else "—")
                self.out(f"| Python | {p['heartbeat_us']:.2f} µs | "
                         f"{p['section_us']:.2f} µs | "
                         f"{p['clock_floor_us']:.2f} µs | {timer} |")
            self.out("")

    # --- targets ------------------------------------------------------------
    def targets(self):
        """The targets set by the issues, each with its verdict."""
        rows = []

        def launch(n):
            r = self.pick(bench="launch", nproc=n)
            return r[0] if r else None

        def verdict(ok, text):
            return f"**{'met' if ok else 'not met'}**: {text}"

        launches = [r for r in (launch(1), launch(4)) if r]
        if launches:
            speeds = [r["torchrun"]["wall_s"][0] / r["ctrun"]["wall_s"][0]
                      for r in launches]
            rows.append((
                "launch to exit ≥ 60× faster than torchrun, N = 1 and 4",
                verdict(min(speeds) >= 60,
                        " and ".join(f"{x:.0f}×" for x in speeds))))
        near = [r for r in self.pick(bench="launch")
                if r["nproc"] <= 16 and r.get("floor")]
        if near:
            over = {r["nproc"]: (r["ctrun"]["wall_s"][0] -
                                 r["floor"]["wall_s"][0]) * 1000
                    for r in near}
            rows.append((
                "launch to exit within the floor + 10 ms, N ≤ 16",
                verdict(max(over.values()) <= 10, ", ".join(
                    f"N = {n}: +{ms:.1f} ms" for n, ms in sorted(
                        over.items())))))
        if (l4 := launch(4)):
            rss = l4["ctrun"]["rss_mib"][0]
            mem = l4["torchrun"]["rss_mib"][0] / rss
            rows.append(("agent memory ≥ 25× less than torchrun's",
                         verdict(mem >= 25, f"{mem:.1f}× ({rss:.1f} MiB)")))
        rec = {r["bench"]: r for r in self.rows
               if r["bench"] in ("nodes_2", "agent_kill", "worker_kill")}
        if isinstance(rec.get("nodes_2", {}).get("ctrun"), list) and \
                isinstance(rec["nodes_2"].get("torchrun"), list):
            x = rec["nodes_2"]["torchrun"][0] / rec["nodes_2"]["ctrun"][0]
            rows.append(("2-node start to exit ≥ 20× faster than torchrun",
                         verdict(x >= 20, f"{x:.0f}×")))
        for name, limit, text in (
                ("agent_kill", 1.0, "survivors of a killed agent running "
                                    "the next round within 1 s"),
                ("worker_kill", 0.3, "killed worker → all workers running "
                                     "again within 0.3 s")):
            c = rec.get(name, {}).get("ctrun")
            if isinstance(c, list):
                rows.append((text, verdict(c[0] <= limit,
                                           f"{c[0] * 1000:.0f} ms")))
        torch_rec = {r["bench"]: r for r in self.rows
                     if r["bench"].startswith("pytorch_")}
        for name, limit, text in (
                ("pytorch_worker_kill", 0.5,
                 "PyTorch job, worker `kill -9` → every rank stepping, in "
                 "process, within 0.5 s and ≥ 8× torchrun"),
                ("pytorch_node_kill", 1.0,
                 "PyTorch job, node `kill -9` → every rank stepping, in "
                 "process, within 1 s")):
            r = torch_rec.get(name)
            if not r or not r.get("inprocess"):
                continue
            s = r["inprocess"]["median"]
            t = (r.get("torchrun") or {}).get("median")
            ok = s <= limit and (name != "pytorch_worker_kill" or
                                 (t is not None and t / s >= 8))
            rows.append((text, verdict(ok, f"{s * 1000:.0f} ms" + (
                f", {t / s:.0f}× torchrun" if t else
                ", torchrun never"))))
        spare = torch_rec.get("pytorch_spare_kill")
        if spare and spare.get("hot_inprocess"):
            hot = spare["hot_inprocess"]["median"]
            cold = (spare.get("ctrun_cold") or {}).get("median")
            rows.append((
                "PyTorch job, agent `kill -9` → a hot spare's rank stepping "
                "within 0.3 s and ≥ 5× a cold new node",
                verdict(hot <= 0.3 and cold is not None and cold / hot >= 5,
                        f"{hot * 1000:.0f} ms" +
                        (f", {cold / hot:.0f}× cold" if cold else ""))))
        for agents, limit in ((4096, 500), (16384, 2000)):
            runs = self.pick(bench="rendezvous", impl="ctrun", agents=agents)
            if not runs:
                continue
            med = statistics.median(r["all_assigned_ms"] for r in runs)
            rows.append((f"{agents} agents all assigned within "
                         f"{limit / 1000:g} s",
                         verdict(med <= limit, f"{med:.0f} ms")))
        sized = self.pick(bench="rendezvous", impl="ctrun")
        if sized:
            top = max(r["agents"] for r in sized)
            runs = [r for r in sized if r["agents"] == top]
            cpu = statistics.median(r["daemon_cpu_s"] for r in runs) / top
            rss = statistics.median(r["daemon_peak_rss_mib"]
                                    for r in runs) / top
            rows.append((f"ctrund ≤ 60 µs of CPU and ≤ 10 KiB per agent "
                         f"({top} agents)",
                         verdict(cpu <= 60e-6 and rss * 1024 <= 10,
                                 f"{cpu * 1e6:.0f} µs, "
                                 f"{rss * 1024:.0f} KiB")))
        alone = self.pick(bench="etcd-rendezvous", impl="ctrun")
        on_etcd = self.pick(bench="etcd-rendezvous", impl="ctrun-etcd")
        if alone and on_etcd:
            top = max(r["agents"] for r in on_etcd)
            a = statistics.median(r["all_assigned_ms"] for r in alone
                                  if r["agents"] == top)
            e = statistics.median(r["all_assigned_ms"] for r in on_etcd
                                  if r["agents"] == top)
            rows.append((f"{top} agents through ctrund on etcd within 1.5× "
                         "of ctrund alone",
                         verdict(e <= 1.5 * a, f"{e / a:.2f}×")))
        sets = [r["ops_per_s"] for r in self.pick(
            bench="etcd-store", impl="ctrun-etcd", op="set", clients=8)]
        if sets:
            med = statistics.median(sets)
            rows.append(("≥ 5k blocking sets/s, 8 clients, ctrund on a "
                         "3-member etcd", verdict(med >= 5000, f"{med:.0f}/s")))
        for c in (1, 8):
            a = spread([r["ops_per_s"] for r in self.pick(
                impl="ctrun", bench="store", op="get", clients=c)])
            b = spread([r["ops_per_s"] for r in self.pick(
                impl="tcpstore", bench="store", op="get", clients=c)])
            if a and b:
                rows.append((f"store `get` ≥ 2× TCPStore, {c} client"
                             f"{'s' if c > 1 else ''}",
                             verdict(a[0] >= 2 * b[0],
                                     f"{a[0] / b[0]:.2f}×")))
        beats = {r["impl"]: r for r in self.pick(bench="heartbeat")}
        if (c := beats.get("ctrun-c++")):
            rows.append(("`ctrun::Heartbeat()` under 2 µs",
                         verdict(c["heartbeat_ns"] < 2000,
                                 f"{c['heartbeat_ns']:.0f} ns")))
        if (p := beats.get("ctrun-python")):
            rows.append(("`ctrun.heartbeat()` under 20 µs",
                         verdict(p["heartbeat_us"] < 20,
                                 f"{p['heartbeat_us']:.2f} µs")))
        b64 = [r["median_ms"] for r in self.pick(
            bench="broadcast", impl="ctrun", waiters=64)]
        if b64:
            med = statistics.median(b64)
            rows.append(("64-waiter broadcast within 5 ms",
                         verdict(med <= 5, f"{med:.1f} ms")))
        if rows:
            self.out("### Against the targets", "", "| target | result |",
                     "|---|---|", *[f"| {t} | {v} |" for t, v in rows], "")


def series_block(name, points):
    lines = [f"${name} << EOD"]
    for x, s in points:
        if s is not None:
            lines.append(f"{x} {s[0] * 1000} {s[1] * 1000} {s[2] * 1000}")
    lines.append("EOD")
    return "\n".join(lines)


def line_plot(title, xlabel, ylabel, data, names, logx=False):
    """data: (x, spread_1, spread_2, ...) in seconds; lines with min-max
    error bars, log-log."""
    blocks, plots = [], []
    styles = ["lc rgb '#1f77b4' pt 7", "lc rgb '#d62728' pt 5",
              "lc rgb '#7f7f7f' dt 2 pt 0"]
    for i, name in enumerate(names):
        points = [(row[0], row[i + 1]) for row in data]
        if not any(s is not None for _, s in points):
            continue
        blocks.append(series_block(f"S{i}", points))
        plots.append(f"$S{i} using 1:2:3:4 with yerrorlines {styles[i]} "
                     f"lw 2 title '{name}'")
    return "\n".join(blocks + [
        f"set title '{title}'", f"set xlabel '{xlabel}'",
        f"set ylabel '{ylabel}'", "set logscale y",
        "set logscale x 2" if logx else "", "set key top left",
        "set grid", "plot " + ", ".join(plots)])


def bar_plot(title, bars, names):
    block = ["$B << EOD"] + [f"\"{b[0]}\" {b[1]} {b[2]} {b[3]}"
                             for b in bars] + ["EOD"]
    return "\n".join(block + [
        f"set title '{title}'", "set style data histograms",
        "set style histogram clustered gap 1", "set style fill solid 0.8",
        "set ylabel 'operations per second'", "set yrange [0:*]",
        "set key top left", "set grid y",
        "plot " + ", ".join(
            f"$B using {i + 2}:xtic(1) lc rgb '{color}' title '{n}'"
            for i, (n, color) in enumerate(
                zip(names, ["#1f77b4", "#d62728", "#7f7f7f"])))])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--plots", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    report = Report(load(args.results))
    report.out(f"Measured {os.path.basename(os.path.normpath(args.results))} "
               f"by `bench/run-all.sh{' --quick' if args.quick else ''}` on: "
               f"{machine()}. Everything (launchers, daemons, clients, "
               "stores) shares the same cores.", "")
    report.launch()
    report.recovery()
    report.pytorch_recovery()
    report.rendezvous()
    report.store()
    report.durability()
    report.availability()
    report.hangs()
    report.targets()

    os.makedirs(args.plots, exist_ok=True)
    for name, script in report.plots:
        with tempfile.NamedTemporaryFile("w", suffix=".gp") as f:
            f.write("set terminal pngcairo size 800,480 font 'sans,10'\n")
            f.write(f"set output '{os.path.join(args.plots, name)}.png'\n")
            f.write(script + "\n")
            f.flush()
            subprocess.run(["gnuplot", f.name], check=True)

    with open(args.markdown) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{args.markdown} lacks the {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(args.markdown, "w") as f:
        f.write(head + BEGIN + "\n\n" + "\n".join(report.md).rstrip() +
                "\n\n" + END + tail)


if __name__ == "__main__":
    main()
