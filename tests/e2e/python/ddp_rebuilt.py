"""Real DDP that a kept rank rebuilds inside ctrun.resilient's function, while
a new process also builds it before the function: the two constructors'
broadcasts and the kept ranks' all-reduce never match, so the round after
rank 1's kill never steps (issue: a round that never recovers is silent).
Prints "done RANK" at the end.
"""
import os, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import ctrun

dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Linear(4, 4)
model = DDP(net)  # built before the function: broadcasts in a new process


@ctrun.resilient
def train():
    global model
    if ctrun.round() > 0:
        model = DDP(net)  # on the new group
    for step in range(100):
        if ctrun.round() == 0 and step == 20 and dist.get_rank() == 1:
            os.kill(os.getpid(), 9)
        model(torch.ones(2, 4)).sum().backward()
        ctrun.heartbeat()
        time.sleep(0.02)


train()
print("done", dist.get_rank(), flush=True)
