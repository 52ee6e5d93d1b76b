"""The PyTorch job of pytorch_recovery_bench.py: Gloo all-reduces in a loop,
under ctrun.resilient when ctrun's module is there (a plain call under
torchrun), resuming at the furthest step any rank reached.

    recovery_job.py LOG STEPS KILL

KILL: "worker" (rank 1 SIGKILLs itself at step 30 of the first round),
"agent" (the last rank SIGKILLs its parent, the agent, at step 30), or
"none"; either happens once per LOG. Every rank appends to LOG one line
per finished step: "step TIME RANK WORLD STEP PID WARM"; the killer writes
"kill TIME" first. WARM is 1 when torch was imported before the script ran
(a warm start). RECOVERY_JOB_IMPORTS (module names, comma-separated) are
imported first: heavy imports for the spares benchmark.
"""

import importlib
import os
import signal
import sys
import time

WARM = int("torch" in sys.modules)
for name in filter(None, os.environ.get("RECOVERY_JOB_IMPORTS", "").split(",")):
    importlib.import_module(name)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

try:
    import ctrun

    resilient = ctrun.resilient
except ImportError:  # under torchrun

    def resilient(fn):
        return fn


LOG, STEPS, KILL = sys.argv[1], int(sys.argv[2]), sys.argv[3]
KILL_STEP = 30
state = {"step": 0, "w": torch.zeros(1000)}


def first_kill():
    """True for the first process of the job to ask (a spare that takes
    the killer's rank, or a restarted job, must not kill again)."""
    try:
        os.close(os.open(LOG + ".killed", os.O_CREAT | os.O_EXCL, 0o644))
        return True
    except FileExistsError:
        return False


def write(line):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (line + "\n").encode())
    os.close(fd)


@resilient
def train():
    rank, world = dist.get_rank(), dist.get_world_size()
    step = torch.tensor([state["step"]], dtype=torch.int64)
    dist.all_reduce(step, op=dist.ReduceOp.MAX)
    has = torch.tensor([rank if state["step"] == step.item() else world])
    dist.all_reduce(has, op=dist.ReduceOp.MIN)
    dist.broadcast(state["w"], src=int(has.item()))
    state["step"] = int(step.item())
    first_round = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    while state["step"] < STEPS:
        s = state["step"]
        if first_round and s == KILL_STEP:
            if KILL == "worker" and rank == 1 and first_kill():
                write("kill %.6f" % time.time())
                os.kill(os.getpid(), signal.SIGKILL)
            if (KILL == "agent" and rank == world - 1 and world > 2
                    and first_kill()):
                write("kill %.6f" % time.time())
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(60)
        t = torch.ones(1000)
        dist.all_reduce(t)
        state["w"] += t
        state["step"] = s + 1
        write(
            "step %.6f %d %d %d %d %d"
            % (time.time(), rank, world, state["step"], os.getpid(), WARM)
        )
        time.sleep(0.01)


dist.init_process_group("gloo")
train()
dist.destroy_process_group()
