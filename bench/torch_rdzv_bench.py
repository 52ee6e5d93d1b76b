#!/usr/bin/python3
"""torchrun's c10d rendezvous under N simulated agents, for comparison with
rdzv_bench's against ctrund.

    torch_rdzv_bench.py --agents N [--give_up 60] [--etcd HOST:PORT]

The rendezvous state lives in a TCPStore served by its own process (as the
hosting agent's store would be; it stands for ctrund). The N agents are
threads of this process, each with its own TCPStore connection and its own
DynamicRendezvousHandler over C10dRendezvousBackend, torchrun's defaults
(min = max = N nodes, so no last-call wait), spread over processes of at
most 16 agents (at most 32 processes). Reports the time from the first
join to the last agent's result, and the store process's CPU seconds and
peak RSS, as one JSON line. A run that takes longer than --give_up seconds
is reported with "gave_up": true.

With --etcd, the backend is torchrun's etcd-v2 one (EtcdRendezvousBackend
and EtcdStore over python3-etcd, as `--rdzv_backend=etcd-v2` builds them)
on that etcd (started with --enable-v2), the peer of ctrund on etcd; the
daemon figures are then not measured (etcd serves other clients too).

Threads rather than one process per agent: N Python processes with PyTorch
loaded do not fit on this machine beyond a few dozen. The 16 agents of a
process share its interpreter lock, which may slow torch's side; the store
process's CPU, which does not depend on that, is reported separately.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from proc_stats import cpu_seconds, peak_rss_mib  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def serve_store(port):
    """The store process: a TCPStore server and nothing else."""
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", port, is_master=True,
                     wait_for_workers=False)
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes our stdin or dies
    del store


def run_agents(n, give_up, make_handler, before=None):
    """Runs N agents, threads over processes of at most 16 so that they do
    not all queue for one interpreter lock, each agent's handler made by
    make_handler() in its process. Calls before() once every handler is
    made, just before the start. Returns (finish times, start, processes)."""
    def agents_process(mine, go, report):
        handlers = [make_handler() for _ in mine]
        os.write(report, b"r")
        os.read(go, 1)
        done = []

        def agent(h):
            try:
                h.next_rendezvous()
                done.append(time.perf_counter())
            except Exception:  # a join timeout: counted as giving up
                pass

        threads = [threading.Thread(target=agent, args=(h,), daemon=True)
                   for h in handlers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(give_up + 5)
        os.write(report, (json.dumps(done) + "\n").encode())
        os._exit(0)

    k = min(32, max(1, (n + 15) // 16))
    children = []
    for c in range(k):
        go_r, go_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            os.close(rep_r)
            agents_process(range(c, n, k), go_r, rep_w)
        os.close(go_r)
        os.close(rep_w)
        children.append((pid, go_w, os.fdopen(rep_r)))
    for _, _, rep in children:
        assert rep.read(1) == "r"
    if before:
        before()
    start = time.perf_counter()
    for _, go, _ in children:
        os.write(go, b"g")
    finished = []
    for pid, _, rep in children:
        finished += json.loads(rep.readline() or "[]")
        os.waitpid(pid, 0)
    return finished, start, k


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, required=True)
    parser.add_argument("--give_up", type=float, default=60)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--etcd", help="HOST:PORT of an etcd with the v2 API")
    args = parser.parse_args()
    if args.serve:
        return serve_store(args.serve)
    if args.etcd:
        return etcd_v2(args)

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend)
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler, RendezvousTimeout)

    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--agents", "0",
                               "--serve", str(port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert server.stdout.readline().strip() == b"ready"
        n = args.agents
        run_id = f"bench-{n}"

        def make_handler():
            store = TCPStore("127.0.0.1", port, is_master=False,
                             timeout=timedelta(seconds=args.give_up + 30))
            backend = C10dRendezvousBackend(store, run_id)
            return DynamicRendezvousHandler.from_backend(
                run_id, store, backend, min_nodes=n, max_nodes=n,
                timeout=RendezvousTimeout(
                    join=timedelta(seconds=args.give_up)))

        cpu = {}
        finished, start, k = run_agents(
            n, args.give_up, make_handler,
            before=lambda: cpu.update(before=cpu_seconds(server.pid)))
        cpu_before = cpu["before"]
        gave_up = len(finished) < n
        print(json.dumps({
            "bench": "rendezvous", "impl": "torchrun", "agents": n,
            "processes": k,
            "all_assigned_ms": None if gave_up
            else (max(finished) - start) * 1000,
            "assigned": len(finished), "gave_up": gave_up,
            "daemon_cpu_s": cpu_seconds(server.pid) - cpu_before,
            "daemon_peak_rss_mib": peak_rss_mib(server.pid)}), flush=True)
    finally:
        server.kill()
        server.wait()
    # The handlers' keep-alive threads would keep the process up.
    sys.stdout.flush()
    os._exit(0)


def etcd_v2(args):
    """The same rendezvous on torchrun's etcd-v2 backend: N agent threads
    over processes of at most 16, each with its own etcd client."""
    import etcd
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler, RendezvousTimeout)
    from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import (
        EtcdRendezvousBackend)
    from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore

    host, port = args.etcd.rsplit(":", 1)
    n = args.agents
    run_id = f"bench-{n}-{os.getpid()}-{int(time.time() * 1000)}"

    def make_handler():
        client = etcd.Client(host=host, port=int(port), protocol="http",
                             read_timeout=int(args.give_up) + 30)
        backend = EtcdRendezvousBackend(
            client, run_id, key_prefix="/torch/elastic/rendezvous")
        store = EtcdStore(client, f"/torch/elastic/store/{run_id}")
        return DynamicRendezvousHandler.from_backend(
            run_id, store, backend, min_nodes=n, max_nodes=n,
            timeout=RendezvousTimeout(join=timedelta(seconds=args.give_up)))

    finished, start, k = run_agents(n, args.give_up, make_handler)
    gave_up = len(finished) < n
    print(json.dumps({
        "bench": "rendezvous", "impl": "torchrun-etcd-v2", "agents": n,
        "processes": k,
        "all_assigned_ms": None if gave_up else (max(finished) - start) * 1000,
        "assigned": len(finished), "gave_up": gave_up}), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
