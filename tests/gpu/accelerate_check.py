"""An accelerate script, unchanged for ctrun: Accelerator() reads the
launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)
and must land each process on its own GPU in one process group."""
import os

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from agree import report

accelerator = Accelerator()
world = int(os.environ["WORLD_SIZE"])
if accelerator.num_processes != world:
    raise SystemExit(f"accelerate sees {accelerator.num_processes} processes; "
                     f"WORLD_SIZE={world}")
torch.manual_seed(0)
x = torch.randn(512, 16)
y = x @ (torch.arange(16, dtype=torch.float32) / 16).unsqueeze(1)
loader = DataLoader(TensorDataset(x, y), batch_size=32)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for epoch in range(5):
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
report("accelerate", accelerator.unwrap_model(model), loss)
