"""A worker that forms a Gloo process group or never does, then waits.

    pg_probe.py init|none SECONDS
"""
import sys
import time

import torch.distributed as dist

mode, seconds = sys.argv[1], float(sys.argv[2])
if mode == "init":
    dist.init_process_group("gloo")
time.sleep(seconds)
if mode == "init":
    dist.destroy_process_group()
