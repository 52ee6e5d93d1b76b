#!/usr/bin/python3
"""ctrun against torchrun, side by side: start-to-exit and agent memory.

    launcher_bench.py --ctrun build/launcher/ctrun --floors build/bench/floors
                      [--runs 5] [--nprocs 1,4,16,64]

Each run launches `--standalone --nproc_per_node=N --no_python true` (N
workers that exit at once) and measures the wall time from start to exit and
the launcher's peak resident memory (ru_maxrss from wait4, which covers the
process and its reaped children; the workers are `true`, so the launcher's
own peak dominates). Every command runs under `floors run`, which starts it
and reports both: from Python, ru_maxrss would start at Python's own peak
(subprocess vforks, and exec keeps the old address space's peak). torchrun is Debian's, through scripts/torchrun-compat.py
(see there), with --monitor_interval=0.1 as today's torchrun defaults.
The floor is `floors spawn N`: start N `true` processes and wait for them,
timed the same way.
Prints a table of medians (min-max) and ctrun/torchrun ratios, and one JSON
line per configuration.
"""
import argparse
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = [os.environ.get("PYTHON_EXEC", "/usr/bin/python3"),
            os.path.join(HERE, "..", "scripts", "torchrun-compat.py"),
            "--monitor_interval=0.1"]


def measure(floors, cmd):
    out = subprocess.run([floors, "run"] + cmd, check=True,
                         capture_output=True, text=True).stdout
    result = json.loads(out)
    if result["exit"] != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {result['exit']}")
    return result["wall_s"], result["maxrss_kib"] / 1024.0  # KiB -> MiB


def summary(values):
    return statistics.median(values), min(values), max(values)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctrun", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nprocs", default="1,4,16,64")
    parser.add_argument("--floors", required=True,
                        help="the floors program (bench/floors.cc)")
    args = parser.parse_args()
    launchers = {"ctrun": [args.ctrun], "torchrun": TORCHRUN}
    rows = []
    for n in [int(x) for x in args.nprocs.split(",")]:
        flags = ["--standalone", f"--nproc_per_node={n}", "--no_python",
                 "true"]
        result = {"bench": "launch", "nproc": n}
        for name, base in launchers.items():
            samples = [measure(args.floors, base + flags)
                       for _ in range(args.runs)]
            result[name] = {
                "wall_s": summary([s[0] for s in samples]),
                "rss_mib": summary([s[1] for s in samples]),
            }
        samples = [measure(args.floors, [args.floors, "spawn", str(n)])
                   for _ in range(args.runs)]
        result["floor"] = {"wall_s": summary([s[0] for s in samples])}
        print(json.dumps(result), flush=True)
        rows.append(result)

    print(f"\nlaunch --standalone --no_python true, {args.runs} runs: "
          "median (min-max)")
    print(f"{'N':>3} {'ctrun wall':>22} {'torchrun wall':>22} {'faster':>8} "
          f"{'ctrun RSS':>18} {'torchrun RSS':>20} {'smaller':>8}")
    for r in rows:
        c, t = r["ctrun"], r["torchrun"]
        fmt_t = lambda s: f"{s[0]*1000:.1f} ms ({s[1]*1000:.1f}-{s[2]*1000:.1f})"
        fmt_m = lambda s: f"{s[0]:.1f} MiB ({s[1]:.0f}-{s[2]:.0f})"
        print(f"{r['nproc']:>3} {fmt_t(c['wall_s']):>22} "
              f"{fmt_t(t['wall_s']):>22} "
              f"{t['wall_s'][0] / c['wall_s'][0]:>7.0f}x "
              f"{fmt_m(c['rss_mib']):>18} {fmt_m(t['rss_mib']):>20} "
              f"{t['rss_mib'][0] / c['rss_mib'][0]:>7.1f}x")


if __name__ == "__main__":
    main()
