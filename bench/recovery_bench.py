#!/usr/bin/python3
"""Multi-node start-up and recovery, ctrun against torchrun side by side.

    recovery_bench.py --ctrun build/launcher/ctrun [--runs 3] [--give_up 60]
                      [--nodes 2,4]

Nodes are agents on one machine (loopback). Measures, as median (min-max):
  nodes       start-to-exit of an N-node job (N from --nodes) of one `true`
              worker per node, with the rendezvous hosted by one agent
              (ctrun: c10d on 127.0.0.2, agents --local_addr 127.0.0.2, .3,
              ...; torchrun: c10d on 127.0.0.1).
  agent_kill  3 agents (--nnodes=2:3), one killed with SIGKILL: time until
              every survivor's worker runs again in the next round.
  worker_kill 1 agent, 4 workers (--max_restarts=1), one worker killed with
              SIGKILL: time until all 4 workers run again.
With --floor (bench/floors.cc), each gets its physical floor under
"floor": starting the processes it needs again (`floors spawn K`: 2N for N
nodes, 2 workers after an agent loss, 4 after a worker loss).
Workers are /bin/sh loops that record `date +%s.%N` when they start, so
times are on the same clock as the kill. torchrun is Debian's, through
scripts/torchrun-compat.py, with --monitor_interval=0.1. A recovery that
does not happen within --give_up seconds is reported as such.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = [os.environ.get("PYTHON_EXEC", "/usr/bin/python3"),
            os.path.join(HERE, "..", "scripts", "torchrun-compat.py"),
            "--monitor_interval=0.1"]


# A run whose job never got going, as opposed to one that never recovered.
NOT_STARTED = "not started"


def free_port(host):
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def worker_script(log):
    """A worker program (a file: torchrun rewrites "$$" in arguments) that
    records one line per start: time, world size, restart count, pid."""
    path = log + ".sh"
    with open(path, "w") as f:
        f.write('#!/bin/sh\n'
                f'echo "$(date +%s.%N) $WORLD_SIZE $TORCHELASTIC_RESTART_COUNT '
                f'$$" >> {log}\n'
                'while true; do sleep 0.05; done\n')
    os.chmod(path, 0o755)
    return path


def starts(log):
    if not os.path.exists(log):
        return []
    out = []
    with open(log) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4:
                out.append((float(parts[0]), int(parts[1]), int(parts[2]),
                            int(parts[3])))
    return out


def wait_for(predicate, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def time_recovery(log, kill, workers, give_up):
    """Kills, then waits until `workers` workers have started again; returns
    the seconds that took, or None after `give_up`."""
    killed_at = time.time()
    kill()

    def restarted():
        return sorted(s[0] for s in starts(log) if s[0] > killed_at)

    if not wait_for(lambda: len(restarted()) >= workers, give_up):
        return None
    return restarted()[workers - 1] - killed_at


def stop(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def spawn(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def node_cmd(launcher, kind, node, port, nnodes, extra):
    if kind == "ctrun":
        return [launcher, f"--local_addr=127.0.0.{node}",
                f"--nnodes={nnodes}", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.2:{port}", "--rdzv_id=bench",
                "--rdzv_conf=last_call_timeout=1"] + extra
    return TORCHRUN + [f"--nnodes={nnodes}", "--rdzv_backend=c10d",
                       f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=bench",
                       "--rdzv_conf=last_call_timeout=1"] + extra


def nodes(launcher, kind, count):
    port = free_port("127.0.0.2" if kind == "ctrun" else "127.0.0.1")
    start = time.time()
    procs = [spawn(node_cmd(launcher, kind, n, port, count,
                            ["--nproc_per_node=1", "--no_python", "true"]))
             for n in range(2, 2 + count)]
    for p in procs:
        p.wait()
    return time.time() - start


def agent_kill(launcher, kind, give_up):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "starts")
        port = free_port("127.0.0.2" if kind == "ctrun" else "127.0.0.1")
        script = worker_script(log)
        procs = [spawn(node_cmd(launcher, kind, n, port, "2:3",
                                ["--nproc_per_node=1", "--no_python",
                                 script]))
                 for n in (2, 3, 4)]
        try:
            if not wait_for(lambda: len(starts(log)) >= 3, give_up):
                return NOT_STARTED
            # Not the hosting agent (node 2 for ctrun, first for torchrun):
            # with an agent-hosted rendezvous, its loss ends the job for
            # both launchers.
            return time_recovery(
                log, lambda: os.killpg(procs[2].pid, signal.SIGKILL), 2,
                give_up)
        finally:
            stop(procs)


def worker_kill(launcher, kind, give_up):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "starts")
        script = worker_script(log)
        base = [launcher] if kind == "ctrun" else TORCHRUN
        proc = spawn(base + ["--standalone", "--nproc_per_node=4",
                             "--max_restarts=1", "--no_python", script])
        try:
            if not wait_for(lambda: len(starts(log)) >= 4, give_up):
                return NOT_STARTED
            victim = starts(log)[0][3]
            return time_recovery(
                log, lambda: os.kill(victim, signal.SIGKILL), 4, give_up)
        finally:
            stop([proc])


def spawn_time(floors, processes):
    start = time.time()
    subprocess.run([floors, "spawn", str(processes)], check=True)
    return time.time() - start


def summary(samples):
    if any(s == NOT_STARTED for s in samples):
        return NOT_STARTED
    done = [s for s in samples if s is not None]
    if not done:
        return None
    return [statistics.median(done), min(done), max(done),
            len(samples) - len(done)]


def fmt(s, give_up):
    if s == NOT_STARTED:
        return "job did not start"
    if s is None:
        return f"never (>{give_up:.0f} s)"
    text = f"{s[0]*1000:.0f} ms ({s[1]*1000:.0f}-{s[2]*1000:.0f})"
    if s[3]:
        text += f", {s[3]} never"
    return text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctrun", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--give_up", type=float, default=60)
    parser.add_argument("--nodes", default="2,4")
    parser.add_argument("--floor", help="the floors program (bench/floors.cc)")
    args = parser.parse_args()
    floor_processes = {f"nodes_{n}": 2 * n
                       for n in map(int, args.nodes.split(","))}
    floor_processes |= {"agent_kill": 2, "worker_kill": 4}
    benches = {
        f"nodes_{n}": (lambda n: lambda kind: nodes(args.ctrun, kind, n))(n)
        for n in map(int, args.nodes.split(","))
    }
    benches |= {
        "agent_kill": lambda kind: agent_kill(args.ctrun, kind, args.give_up),
        "worker_kill": lambda kind: worker_kill(args.ctrun, kind,
                                                args.give_up),
    }
    rows = {}
    for name, run in benches.items():
        rows[name] = {}
        for kind in ("ctrun", "torchrun"):
            samples = [run(kind) for _ in range(args.runs)]
            rows[name][kind] = summary(samples)
        result = {"bench": name, **rows[name]}
        if args.floor:
            result["floor"] = summary([
                spawn_time(args.floor, floor_processes[name])
                for _ in range(args.runs)])
        print(json.dumps(result), flush=True)
    print(f"\nmulti-node, {args.runs} runs: median (min-max)")
    print(f"{'':12} {'ctrun':>26} {'torchrun':>28} {'ratio':>7}")
    for name, r in rows.items():
        c, t = r["ctrun"], r["torchrun"]
        numbers = all(isinstance(x, list) for x in (c, t))
        ratio = f"{t[0] / c[0]:.0f}x" if numbers else "-"
        print(f"{name:12} {fmt(c, args.give_up):>26} "
              f"{fmt(t, args.give_up):>28} {ratio:>7}")


if __name__ == "__main__":
    # Agents killed with their process group (watchdog included) cannot
    # remove their run directories: keep them in a folder of our own.
    scratch = tempfile.mkdtemp(prefix="recovery-bench-")
    os.environ["TMPDIR"] = scratch
    try:
        main()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
