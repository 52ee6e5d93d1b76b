"""A worker that steps at its rank's own pace until ctrun.should_stop().

    stop_stepper.py [--ready_dir DIR] [--unchecked_rank R]

Each step sleeps 2 ms x (RANK + 1) and sends a heartbeat. At step 5 it
prints "ready PID" (and, with --ready_dir, creates DIR/ready.RANK); once
ctrun.should_stop() is true it prints "stop rank=R step=N why=WHY" and
exits 0. Rank --unchecked_rank never calls the stop check.
"""
import argparse
import os
import sys
import time

import ctrun

parser = argparse.ArgumentParser()
parser.add_argument("--ready_dir")
parser.add_argument("--unchecked_rank", type=int, default=-1)
args = parser.parse_args()
rank = int(os.environ["RANK"])
checks = rank != args.unchecked_rank
step = 0
while True:
    time.sleep(0.002 * (rank + 1))
    ctrun.heartbeat()
    step += 1
    if step == 5:
        print("ready", os.getpid(), flush=True)
        if args.ready_dir:
            open(os.path.join(args.ready_dir, "ready.%d" % rank), "w").close()
    if checks and ctrun.should_stop():
        print("stop rank=%d step=%d why=%s" % (rank, step, ctrun.preempted()), flush=True)
        sys.exit(0)
