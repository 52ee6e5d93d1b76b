"""PyTorch's own DDP recipe on GPUs, unchanged for ctrun: set_device from
LOCAL_RANK, init_process_group("nccl") from the environment, DDP with
device_ids, then every rank's parameters compared (agree.py)."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from agree import report

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 1).cuda(), device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
weights = (torch.arange(16, dtype=torch.float32) / 16).unsqueeze(1).cuda()
data = torch.Generator().manual_seed(dist.get_rank())
for step in range(200):
    x = torch.randn(64, 16, generator=data).cuda()
    loss = torch.nn.functional.mse_loss(model(x), x @ weights)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
report("ddp", model.module, loss)
dist.destroy_process_group()
