"""Whether a ctrun worker's env:// init waits for rank 0's store to listen.

Prints "wrapped R BOOL" (torch's env:// handler is ctrun's), then, on rank
1, "waited BOOL" (a stand-in for torch's handler, called for rank 1 while
nothing listens on the master port yet, ran only once a listener came a
second later), "rank0-waited BOOL" (the same for rank 0: it must not
wait), "unresolved-passed-on BOOL" and "bad-port-passed-on BOOL" (a
master name that does not resolve, or a port out of range, goes to torch
at once, not after the wait's time). Then both ranks form a Gloo group,
rank 0 half a second late, and print "sum R VALUE" of an all-reduce of
1 + rank.
"""
import os
import socket
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

rendezvous = sys.modules["torch.distributed.rendezvous"]
rank = int(os.environ["RANK"])
handler = rendezvous._rendezvous_handlers["env"]
print("wrapped %d %s" % (rank, getattr(handler, "_ctrun_waits", False)), flush=True)


def stand_in(url, **kwargs):
    calls.append(listening.is_set())
    yield None


def listener_came_first(wrapped, url):
    """Calls `wrapped` with a master port on which a listener comes a second
    later; whether the stand-in ran after it came."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(server.getsockname()[1])
    listening.clear()
    calls.clear()

    def listen_later():
        time.sleep(1.0)
        listening.set()  # before listen(): no connect succeeds earlier
        server.listen(8)

    later = threading.Thread(target=listen_later)
    later.start()
    next(wrapped(url, timeout=timedelta(seconds=30)))
    later.join()
    server.close()
    return calls[0]


listening, calls = threading.Event(), []
if rank == 1 and hasattr(handler, "_ctrun_waits"):
    from ctrun import _recovery

    fake = type(sys)("fake_rendezvous")
    fake._rendezvous_handlers = {"env": stand_in}
    _recovery._patch_env_rendezvous(fake)
    wrapped = fake._rendezvous_handlers["env"]
    saved = dict(os.environ)
    print("waited %s" % listener_came_first(wrapped, "env://?rank=1&world_size=2"), flush=True)
    # Rank 0 (from the URL, as init_process_group passes it) hosts the store.
    print("rank0-waited %s" % listener_came_first(wrapped, "env://?rank=0&world_size=2"), flush=True)
    # A master name that does not resolve is torch's to report, at once.
    os.environ["MASTER_ADDR"] = "no-such-host.invalid"
    began = time.monotonic()
    next(wrapped("env://?rank=1&world_size=2", timeout=timedelta(seconds=30)))
    print("unresolved-passed-on %s" % (time.monotonic() - began < 10), flush=True)
    # So is a port out of range (a socket would take it modulo 65536).
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "70000"
    began = time.monotonic()
    next(wrapped("env://?rank=1&world_size=2", timeout=timedelta(seconds=30)))
    print("bad-port-passed-on %s" % (time.monotonic() - began < 10), flush=True)
    os.environ.clear()
    os.environ.update(saved)

if rank == 0:
    time.sleep(0.5)
dist.init_process_group("gloo")
t = torch.tensor([1.0 + rank])
dist.all_reduce(t)
print("sum %d %g" % (rank, t.item()), flush=True)
dist.destroy_process_group()
