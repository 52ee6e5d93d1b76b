#!/usr/bin/python3
"""PyTorch's TCPStore under the same load as `rdzv_bench store|broadcast`.

  tcpstore_bench.py store --clients C --seconds S
  tcpstore_bench.py broadcast --waiters N --repeats R

Clients are processes (forked after torch is imported), each with its own
TCPStore connection, doing blocking get (then set) in a loop, like
rdzv_bench's threads with their own connections. Broadcast waiters are
threads with their own connections (TCPStore.get releases the GIL).
Prints one JSON object per line, in rdzv_bench's format.
"""
import argparse
import json
import multiprocessing as mp
import threading
import time

import torch.distributed as dist

HOST = "127.0.0.1"


def client_loop(port, op, index, seconds, out):
    store = dist.TCPStore(HOST, port, 1, False)
    key = "key" if op == "get" else f"key{index}"
    value = "v" * 64
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if op == "get":
            store.get(key)
        else:
            store.set(key, value)
        n += 1
    out.put(n)


def bench_store(clients, seconds):
    master = dist.TCPStore(HOST, 0, 1, True)
    master.set("key", "v" * 64)
    ctx = mp.get_context("fork")
    for op in ("get", "set"):
        out = ctx.Queue()
        procs = [ctx.Process(target=client_loop,
                             args=(master.port, op, i, seconds, out))
                 for i in range(clients)]
        for p in procs:
            p.start()
        total = sum(out.get() for _ in procs)
        for p in procs:
            p.join()
        print(json.dumps({"bench": "store", "op": op, "clients": clients,
                          "ops_per_s": round(total / seconds)}), flush=True)


def bench_broadcast(waiters, repeats):
    master = dist.TCPStore(HOST, 0, 1, True)
    clients = [dist.TCPStore(HOST, master.port, 1, False)
               for _ in range(waiters)]
    samples = []
    for r in range(repeats):
        key = f"broadcast-{r}"
        done = [0.0] * waiters

        def wait(i):
            clients[i].get(key)
            done[i] = time.perf_counter()

        threads = [threading.Thread(target=wait, args=(i,))
                   for i in range(waiters)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        start = time.perf_counter()
        master.set(key, "i" * 128)
        for t in threads:
            t.join()
        samples.append((max(done) - start) * 1000)
    samples.sort()
    print(json.dumps({"bench": "broadcast", "waiters": waiters,
                      "median_ms": round(samples[len(samples) // 2], 3),
                      "min_ms": round(samples[0], 3),
                      "max_ms": round(samples[-1], 3)}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["store", "broadcast"])
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--waiters", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.mode == "store":
        bench_store(args.clients, args.seconds)
    else:
        bench_broadcast(args.waiters, args.repeats)


if __name__ == "__main__":
    main()
