#!/usr/bin/python3
"""Time from a failure to every rank stepping again, on a real PyTorch job.

    pytorch_recovery_bench.py --ctrun build/launcher/ctrun [--runs 3]
                              [--give_up 60] [--only worker|node]

The job (recovery_job.py) all-reduces on Gloo in a loop; its workers log
every finished step with the time. Measured side by side, as median
(min-max) of --runs:
  worker  one node, 4 workers (--max_restarts=1); rank 1 SIGKILLs itself
          at step 30: torchrun; ctrun (restart, torchrun's way); ctrun
          --preload=torch (restart, replacements forked warm); ctrun
          --recovery=inprocess (survivors keep their processes).
  node    two nodes of 2 workers (--nnodes=1:2): ctrun's agents on
          127.0.0.2 and .3 meeting at a ctrund; torchrun's on one c10d
          store hosted by the first agent (started a second earlier); the
          last rank (on group rank 1's node) SIGKILLs its agent at step 30.
The figure: from the kill to the moment every rank of the new world has
finished a step (the slowest rank's first step after the kill), with the
parts in-process recovery reports: how many ranks kept their process and
whether the replacement started warm. torchrun is Debian's, through
scripts/torchrun-compat.py.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from recovery_bench import free_port, stop  # the same folder's

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("PYTHON_EXEC", "/usr/bin/python3")
TORCHRUN = [PYTHON, os.path.join(HERE, "..", "scripts", "torchrun-compat.py"),
            "--monitor_interval=0.1"]
JOB = os.path.join(HERE, "recovery_job.py")


def read_log(log):
    kill, steps = None, []
    if not os.path.exists(log):
        return kill, steps
    with open(log) as f:
        for line in f:
            parts = line.split()
            if parts[:1] == ["kill"]:
                kill = float(parts[1])
            elif parts[:1] == ["step"] and len(parts) == 7:
                steps.append((float(parts[1]), int(parts[2]), int(parts[3]),
                              int(parts[4]), int(parts[5]), int(parts[6])))
    return kill, steps


def recovery(log, world):
    """(seconds, kept, warm) once every rank of a `world`-rank world has
    stepped after the kill; None before."""
    kill, steps = read_log(log)
    if kill is None:
        return None
    before = {s[4] for s in steps if s[0] < kill}
    first = {}
    for t, rank, w, _, pid, warm in steps:
        if t > kill and w == world and rank not in first:
            first[rank] = (t, pid, warm)
    if len(first) < world:
        return None
    kept = sum(1 for _, pid, _ in first.values() if pid in before)
    warm = sum(w for _, pid, w in first.values() if pid not in before)
    return max(t for t, _, _ in first.values()) - kill, kept, warm


def spawn(cmd, env=None):
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env=env)


def measure(procs, log, world, give_up):
    end = time.time() + give_up
    try:
        while time.time() < end:
            r = recovery(log, world)
            if r is not None:
                return r
            time.sleep(0.05)
        return None
    finally:
        stop(procs)


def worker_kill(ctrun, variant, give_up):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log")
        job = [JOB, log, "100000", "worker"]
        common = ["--standalone", "--nproc_per_node=4", "--max_restarts=1"]
        if variant == "torchrun":
            cmd = TORCHRUN + common + job
        else:
            flags = {"ctrun": [], "preload": ["--preload=torch"],
                     "inprocess": ["--recovery=inprocess"]}[variant]
            cmd = [ctrun] + common + flags + job
        return measure([spawn(cmd, dict(os.environ, PYTHON_EXEC=PYTHON))],
                       log, 4, give_up)


def node_kill(ctrun, variant, give_up):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log")
        job = [JOB, log, "100000", "agent"]
        env = dict(os.environ, PYTHON_EXEC=PYTHON)
        procs = []
        if variant == "torchrun":
            port = free_port()
            base = TORCHRUN + ["--nnodes=1:2", "--nproc_per_node=2",
                               "--rdzv_backend=c10d",
                               f"--rdzv_endpoint=127.0.0.1:{port}",
                               "--rdzv_id=bench",
                               "--rdzv_conf=last_call_timeout=1"]
            procs.append(spawn(base + job, env))
            time.sleep(1)  # node 1 hosts the rendezvous: it goes first
            procs.append(spawn(base + job, env))
        else:
            port = free_port()
            procs.append(spawn([ctrun.replace("/launcher/ctrun",
                                              "/rendezvous/ctrund"),
                                "--listen", f"127.0.0.1:{port}"]))
            flags = {"ctrun": [], "preload": ["--preload=torch"],
                     "inprocess": ["--recovery=inprocess"]}[variant]
            for n in (2, 3):
                procs.append(spawn(
                    [ctrun, f"--local_addr=127.0.0.{n}", "--nnodes=1:2",
                     "--nproc_per_node=2", "--rdzv_backend=c10d",
                     f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench",
                     "--rdzv_conf=last_call_timeout=1"] + flags + job, env))
        return measure(procs, log, 2, give_up)


def summary(samples):
    done = [s for s in samples if s is not None]
    if not done:
        return None
    secs = [s[0] for s in done]
    return {"median": statistics.median(secs), "min": min(secs),
            "max": max(secs), "never": len(samples) - len(done),
            "kept": max(s[1] for s in done), "warm": max(s[2] for s in done)}


def fmt(s, give_up):
    if s is None:
        return f"never (>{give_up:.0f} s)"
    text = (f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f}), "
            f"kept {s['kept']}, warm {s['warm']}")
    if s["never"]:
        text += f", {s['never']} never"
    return text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctrun", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--give_up", type=float, default=60)
    parser.add_argument("--only", choices=["worker", "node"])
    args = parser.parse_args()
    benches = {"worker": worker_kill, "node": node_kill}
    variants = ["torchrun", "ctrun", "preload", "inprocess"]
    table = []
    for name, run in benches.items():
        if args.only and name != args.only:
            continue
        row = {"bench": f"pytorch_{name}_kill"}
        for variant in variants:
            row[variant] = summary([run(args.ctrun, variant, args.give_up)
                                    for _ in range(args.runs)])
        print(json.dumps(row), flush=True)
        table.append(row)
    print(f"\nfailure -> every rank stepping again, {args.runs} runs: "
          "median (min-max)")
    for row in table:
        base = row["torchrun"]
        print(row["bench"])
        for variant in variants:
            s = row[variant]
            ratio = (f"{base['median'] / s['median']:.1f}x torchrun"
                     if base and s else "-")
            print(f"  {variant:10} {fmt(s, args.give_up):44} {ratio}")


if __name__ == "__main__":
    scratch = tempfile.mkdtemp(prefix="pytorch-recovery-bench-")
    os.environ["TMPDIR"] = scratch
    try:
        main()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
