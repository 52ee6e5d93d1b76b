"""The cost of one progress signal from a Python worker: ctrun.heartbeat()
and a ctrun.section, against a real board file as the agent makes it; and,
side by side, torchrun's way of saying the same thing, an acquire and a
release of torch.distributed.elastic.timer's FileTimerClient on a FIFO that
a reader drains (what `with expires(...)` costs per step).

Prints one JSON object.
"""

import argparse
import atexit
import json
import mmap
import os
import shutil
import struct
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def per_call_us(f, calls):
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--timer_calls", type=int, default=20_000)
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="ctrun-heartbeat-bench-")
    atexit.register(shutil.rmtree, tmp, True)
    board = os.path.join(tmp, "board")
    # The board's layout: worker_lib/include/ctrun/progress_board.h.
    with open(board, "wb") as f:
        f.write(b"CTRUNPB3" + struct.pack("<II", 1, 128) + bytes(64 - 16 + 128))
    os.environ["CTRUN_PROGRESS_FILE"] = board
    os.environ["CTRUN_PROGRESS_SLOT"] = "0"
    sys.path.insert(0, os.path.join(HERE, "..", "worker_lib", "python"))
    import ctrun

    assert ctrun.reported()
    result = {"bench": "heartbeat", "impl": "ctrun-python",
              "calls": args.calls}
    result["heartbeat_us"] = per_call_us(ctrun.heartbeat, args.calls)

    def section():
        with ctrun.section("step"):
            pass

    result["section_us"] = per_call_us(section, args.calls // 10)
    result["clock_floor_us"] = per_call_us(time.monotonic_ns, args.calls)

    try:
        from torch.distributed.elastic.timer import FileTimerClient
    except ImportError:
        FileTimerClient = None
    if FileTimerClient is not None:
        fifo = os.path.join(tmp, "timer.fifo")
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        stop = threading.Event()

        def drain():
            while not stop.is_set():
                try:
                    os.read(reader, 1 << 16)
                except BlockingIOError:
                    time.sleep(0.0005)

        t = threading.Thread(target=drain)
        t.start()
        client = FileTimerClient(fifo)

        def acquire_release():
            client.acquire("step", time.time() + 60)
            client.release("step")

        result["torch_file_timer_us"] = per_call_us(acquire_release,
                                                    args.timer_calls)
        stop.set()
        t.join()
        os.close(reader)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
