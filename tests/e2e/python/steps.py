# Plain steps with ctrun.heartbeat(): --step seconds each, rank --slow_rank
# --slow times slower; in the first attempt, --stall_after steps, a stall of
# --stall seconds.
import argparse
import os
import time

import ctrun

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--step", type=float, default=0.2)
parser.add_argument("--slow_rank", type=int, default=-1)
parser.add_argument("--slow", type=float, default=1.0)
parser.add_argument("--stall_after", type=int, default=-1)
parser.add_argument("--stall", type=float, default=0)
parser.add_argument("--plain", action="store_true", help="heartbeats only")
args = parser.parse_args()

rank = int(os.environ["RANK"])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
assert ctrun.reported()
step_time = args.step * (args.slow if rank == args.slow_rank else 1.0)
for step in range(args.steps):
    ctrun.heartbeat()
    if step == args.stall_after and restart == 0:
        print(f"rank {rank} stalls", flush=True)
        time.sleep(args.stall)
    if args.plain:
        time.sleep(step_time)
        continue
    with ctrun.section("compute"):
        time.sleep(step_time)
ctrun.done()
print(f"rank {rank} done restart={restart}", flush=True)
