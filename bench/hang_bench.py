"""From a hung rank to a stopped job: ctrun against torchrun, side by side.

N workers (plain Python processes, no collective) step every 50 ms; in each
run one rank stops making progress at step 20, writing the wall-clock time
when it does, and sleeps. We measure the time from that moment until the
launcher has stopped every worker and exited (max_restarts=0):

- ctrun --hang_timeout=2: the workers call ctrun.heartbeat() once per step;
  detection, then every worker's Python and native stacks (gdb) written to
  the run directory, then the stop. Also with --hang_evidence_timeout=0 (no
  evidence), to show what the evidence costs.
- torchrun with its file timers, the nearest thing it has
  (TORCHELASTIC_ENABLE_FILE_TIMER=1): each step runs under
  `expires(after=2)`; its FileTimerServer polls every 0.1 s and kills the
  rank, then its agent (--monitor_interval=0.1) stops the others. No
  evidence is kept.
- torchrun without timers waits for the collective's own timeout (Gloo's
  default 30 minutes, NCCL's 10); not run.

Prints a table and one JSON object per run.
"""

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = os.environ.get("PYTHON_EXEC", "/usr/bin/python3")
TORCHRUN = [PYTHON, os.path.join(HERE, "..", "scripts", "torchrun-compat.py"),
            "--monitor_interval=0.1"]
TIMEOUT = 2.0

WORKER = r'''
import os, sys, time
mode, stop_file = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
if mode == "ctrun":
    import ctrun
    from contextlib import nullcontext
    step = lambda: nullcontext()
    beat = ctrun.heartbeat
else:
    from torch.distributed.elastic.timer import FileTimerClient, configure, expires
    configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    step = lambda: expires(after=%(timeout)s, scope="step")
    beat = lambda: None
for i in range(100000):
    with step():
        beat()
        if rank == 1 and i == 20:
            with open(stop_file, "w") as f:
                f.write(repr(time.time()))
            time.sleep(3600)
        time.sleep(0.05)
''' % {"timeout": TIMEOUT}


def run(cmd, stop_file, env, give_up):
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    try:
        proc.wait(timeout=give_up)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
    end = time.time()
    with open(stop_file) as f:
        stopped = float(f.read())
    os.unlink(stop_file)
    return end - stopped if stopped >= start else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctrun", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nprocs", default="4,16")
    parser.add_argument("--give_up", type=float, default=120)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="ctrun-hang-bench-")
    atexit.register(shutil.rmtree, tmp, True)  # with the runs' logs
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    stop_file = os.path.join(tmp, "stopped")
    env = dict(os.environ, PYTHON_EXEC=PYTHON)
    timer_env = dict(env, TORCHELASTIC_ENABLE_FILE_TIMER="1",
                     TORCHELASTIC_TIMER_FILE=os.path.join(tmp, "timer.fifo"))
    impls = {
        "ctrun": (lambda n: [args.ctrun, "--standalone",
                             f"--nproc_per_node={n}", f"--hang_timeout={TIMEOUT}",
                             "--log_dir", tmp, script, "ctrun", stop_file], env),
        "ctrun-no-evidence": (lambda n: [
            args.ctrun, "--standalone", f"--nproc_per_node={n}",
            f"--hang_timeout={TIMEOUT}", "--hang_evidence_timeout=0",
            "--log_dir", tmp, script, "ctrun", stop_file], env),
        "torchrun-file-timer": (lambda n: TORCHRUN + [
            "--standalone", f"--nproc_per_node={n}", script, "timer",
            stop_file], timer_env),
    }
    rows = []
    for n in [int(x) for x in args.nprocs.split(",")]:
        for name, (cmd, run_env) in impls.items():
            for _ in range(args.runs):
                seconds = run(cmd(n), stop_file, run_env, args.give_up)
                row = {"bench": "hang", "impl": name, "nproc": n,
                       "timeout_s": TIMEOUT, "seconds": seconds}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"{'N':>3} {'launcher':<22} {'hang to stopped, median (min-max)':>36}",
          file=sys.stderr)
    for n in sorted({r["nproc"] for r in rows}):
        for name in impls:
            s = [r["seconds"] for r in rows
                 if r["nproc"] == n and r["impl"] == name and r["seconds"]]
            if s:
                print(f"{n:>3} {name:<22} {statistics.median(s):>16.2f} s "
                      f"({min(s):.2f}-{max(s):.2f})", file=sys.stderr)
    print(f"    torchrun (no timers)   waits for the collective's timeout "
          f"(Gloo 1800 s, NCCL 600 s)", file=sys.stderr)


if __name__ == "__main__":
    main()
