#!/usr/bin/python3
"""Time from a failure to every rank stepping again, on a real PyTorch job.

    pytorch_recovery_bench.py --ctrun build/launcher/ctrun [--runs 3]
                              [--give_up 60] [--only worker|node|spare]

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
  spare   three nodes of 1 worker (--nnodes=3) whose imports take 2 s more
          than torch's (slow_import.py); the last rank SIGKILLs its agent
          at step 30. Cold: a new node is started at the kill, as one
          would for torchrun (torchrun's own, and ctrun's without
          --preload); hot: a fourth agent waits with --spares=1 (warm:
          torch and slow_import preloaded), restart mode and
          --recovery=inprocess.
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
            port = free_port("127.0.0.1")
            base = TORCHRUN + ["--nnodes=1:2", "--nproc_per_node=2",
                               "--rdzv_backend=c10d",
                               f"--rdzv_endpoint=127.0.0.1:{port}",
                               "--rdzv_id=bench",
                               "--rdzv_conf=last_call_timeout=1"]
            procs.append(spawn(base + job, env))
            time.sleep(1)  # node 1 hosts the rendezvous: it goes first
            procs.append(spawn(base + job, env))
        else:
            port = free_port("127.0.0.1")
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


def spare_kill(ctrun, variant, give_up):
    """Cold: a node started when the kill is seen; hot: a spare waiting."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log")
        job = [JOB, log, "100000", "agent"]
        env = dict(os.environ, PYTHON_EXEC=PYTHON, PYTHONPATH=HERE,
                   RECOVERY_JOB_IMPORTS="slow_import")
        port = free_port("127.0.0.1")
        procs = []
        if variant == "torchrun_cold":
            base = TORCHRUN + ["--nnodes=3", "--nproc_per_node=1",
                               "--rdzv_backend=c10d",
                               f"--rdzv_endpoint=127.0.0.1:{port}",
                               "--rdzv_id=bench"]

            def agent(_):
                return spawn(base + job, env)
        else:
            procs.append(spawn([ctrun.replace("/launcher/ctrun",
                                              "/rendezvous/ctrund"),
                                "--listen", f"127.0.0.1:{port}"]))
            flags = {"ctrun_cold": ["--preload=none"],
                     "hot": ["--spares=1", "--preload=torch,slow_import"],
                     "hot_inprocess": ["--spares=1",
                                       "--preload=torch,slow_import",
                                       "--recovery=inprocess"]}[variant]

            def agent(n):
                return spawn([ctrun, f"--local_addr=127.0.0.{n}",
                              "--nnodes=3", "--nproc_per_node=1",
                              "--rdzv_backend=c10d",
                              f"--rdzv_endpoint=127.0.0.1:{port}",
                              "--rdzv_id=bench"] + flags + job, env)
        procs.append(agent(2))
        if variant == "torchrun_cold":
            time.sleep(1)  # the first agent hosts the rendezvous
        procs += [agent(3), agent(4)]
        if variant.startswith("hot"):
            procs.append(agent(5))
        else:
            # The replacement node starts when the loss is seen.
            end = time.time() + give_up
            while read_log(log)[0] is None and time.time() < end:
                time.sleep(0.02)
            procs.append(agent(5))
        return measure(procs, log, 3, give_up)


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
    parser.add_argument("--only", choices=["worker", "node", "spare"])
    args = parser.parse_args()
    restart_variants = ["torchrun", "ctrun", "preload", "inprocess"]
    spare_variants = ["torchrun_cold", "ctrun_cold", "hot", "hot_inprocess"]
    benches = {"worker": (worker_kill, restart_variants),
               "node": (node_kill, restart_variants),
               "spare": (spare_kill, spare_variants)}
    table = []
    for name, (run, variants) in benches.items():
        if args.only and name != args.only:
            continue
        row = {"bench": f"pytorch_{name}_kill"}
        for variant in variants:
            row[variant] = summary([run(args.ctrun, variant, args.give_up)
                                    for _ in range(args.runs)])
        print(json.dumps(row), flush=True)
        table.append((row, variants))
    print(f"\nfailure -> every rank stepping again, {args.runs} runs: "
          "median (min-max)")
    for row, variants in table:
        base = row[variants[0]]
        print(row["bench"])
        for variant in variants:
            s = row[variant]
            ratio = (f"{base['median'] / s['median']:.1f}x {variants[0]}"
                     if base and s else "-")
            if variants is spare_variants and row["ctrun_cold"] and s:
                ratio += (f", {row['ctrun_cold']['median'] / s['median']:.1f}x"
                          " ctrun_cold")
            print(f"  {variant:14} {fmt(s, args.give_up):44} {ratio}")


if __name__ == "__main__":
    scratch = tempfile.mkdtemp(prefix="pytorch-recovery-bench-")
    os.environ["TMPDIR"] = scratch
    try:
        main()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
