# A 4-rank Gloo job whose rank --hang_rank sleeps forever before an
# all-reduce in the first attempt (ctrun.heartbeat() once per step); the
# others block in the all-reduce. The second attempt runs to its end.
# --late_beat=S: the sleeper signals its step S seconds after the others
# and only then sleeps, so that its progress is the last to stop.
import argparse
import os
import time

import ctrun
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--hang_rank", type=int, default=2)
parser.add_argument("--hang_step", type=int, default=8)
parser.add_argument("--late_beat", type=float, default=0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
value = torch.zeros(1)
for step in range(args.steps):
    value += 1
    if rank == args.hang_rank and step == args.hang_step and restart == 0:
        if args.late_beat > 0:
            time.sleep(args.late_beat)
            ctrun.heartbeat()
        time.sleep(3600)  # the hang
    ctrun.heartbeat()
    dist.all_reduce(value)
    time.sleep(0.05)
ctrun.done()  # what follows is not a step
print(f"final rank={rank} restart={restart} value={value.item()}", flush=True)
dist.destroy_process_group()
