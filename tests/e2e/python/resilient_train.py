"""A Gloo training under ctrun.resilient, for in-process recovery tests.

Each step all-reduces a tensor that depends only on the step and the rank,
so the final parameters are known in closed form. A rank that (re)enters the
training function agrees with the others where to resume: every rank learns
the furthest step any rank reached and takes that rank's state, so a new
process (which has none) continues where the survivors are.

Options:
  --steps N          steps in all (default 60)
  --kill_rank R      rank R SIGKILLs itself at --kill_step in round 0
  --kill_step S      (default 20)
  --kill_agent       rank R kills its agent instead (ctrun's parent pid)
  --block sleep|loop|ignore
                     rank --block_rank blocks at --kill_step in round 0:
                     in time.sleep, in a Python loop, or with its release
                     signal ignored and sleeping (never released)
  --step_sleep SEC   pause per step (default 0.02)
  --start_delay SEC  a process started in a later round (a replacement)
                     says "starting pid=P round=K" and waits SEC before it
                     forms its group (a slow start: imports, a dataset),
                     then says "forming pid=P"
  --checkpoint FILE  rank 0 saves the state there after each step, and every
                     process starts from it when it exists (a job restarted
                     the old way resumes from it)

Prints, per (re)entry: "enter rank=R pid=P round=K world=W step=S"; at the
end: "final rank=R pid=P world=W sum=X". On a spare node (ctrun --spares)
it parks in ctrun.wait_for_slot() first, saying "parked pid=P".
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import ctrun

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--kill_rank", type=int, default=-1)
parser.add_argument("--kill_step", type=int, default=20)
parser.add_argument("--kill_agent", action="store_true")
parser.add_argument("--block", default="")
parser.add_argument("--block_rank", type=int, default=-1)
parser.add_argument("--step_sleep", type=float, default=0.02)
parser.add_argument("--start_delay", type=float, default=0.0)
parser.add_argument("--checkpoint", default="")
args = parser.parse_args()

state = {"step": 0, "w": torch.zeros(8, dtype=torch.float64)}
if args.checkpoint and os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint)


def save():
    # Whole or not at all: a restart may stop rank 0 in the middle.
    partial = args.checkpoint + ".partial"
    torch.save(state, partial)
    os.replace(partial, args.checkpoint)


def contribution(step, rank):
    return torch.full((8,), float(step * 10 + rank), dtype=torch.float64)


@ctrun.resilient
def train():
    rank, world = dist.get_rank(), dist.get_world_size()
    # Where to resume: the furthest step any rank has, from the lowest
    # rank that has it.
    step = torch.tensor([state["step"]], dtype=torch.int64)
    dist.all_reduce(step, op=dist.ReduceOp.MAX)
    has = torch.tensor([rank if state["step"] == step.item() else world])
    dist.all_reduce(has, op=dist.ReduceOp.MIN)
    w = state["w"]
    dist.broadcast(w, src=int(has.item()))
    state["step"] = int(step.item())
    print(
        f"enter rank={rank} pid={os.getpid()} round={ctrun.round()} "
        f"world={world} step={state['step']}",
        flush=True,
    )
    first_round = os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
    while state["step"] < args.steps:
        s = state["step"]
        if first_round and s == args.kill_step and rank == args.kill_rank:
            if args.kill_agent:
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(60)
            os.kill(os.getpid(), signal.SIGKILL)
        if first_round and s == args.kill_step and rank == args.block_rank:
            if args.block == "sleep":
                time.sleep(600)
            elif args.block == "loop":
                while True:
                    pass
            elif args.block == "ignore":
                signal.signal(int(signal.SIGRTMIN) + 7, signal.SIG_IGN)
                time.sleep(600)
        total = contribution(s, rank)
        dist.all_reduce(total)
        w += total
        state["step"] = s + 1
        if args.checkpoint and rank == 0:
            save()
        ctrun.heartbeat()
        time.sleep(args.step_sleep)
    return dist.get_world_size()


if os.environ.get("CTRUN_SPARE") == "1":
    print(f"parked pid={os.getpid()} rank={os.environ.get('RANK', 'none')}",
          flush=True)
ctrun.wait_for_slot()
if args.start_delay and os.environ.get("TORCHELASTIC_RESTART_COUNT") != "0":
    print(f"starting pid={os.getpid()} round={ctrun.round()}", flush=True)
    time.sleep(args.start_delay)
    print(f"forming pid={os.getpid()}", flush=True)
dist.init_process_group("gloo")
world = train()
print(
    f"final rank={dist.get_rank()} pid={os.getpid()} world={world} "
    f"sum={state['w'].sum().item():.1f}",
    flush=True,
)
dist.destroy_process_group()
sys.exit(0)
