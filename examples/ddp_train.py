"""A small PyTorch DDP training run, launched unchanged by ctrun or torchrun.

Data-parallel linear regression on a synthetic problem with known weights:
each rank takes its own shard, gradients are averaged by DDP over Gloo
(CPU), the loss falls towards zero, and every rank ends with the same
parameters, which it prints as a checksum:

    ctrun --standalone --nproc_per_node=4 examples/ddp_train.py --steps 200

The process group comes from the launcher's environment (env://: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

TRUE_WEIGHTS = torch.tensor([[2.0], [-3.0], [0.5], [1.0]])
TRUE_BIAS = 0.25


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--fail_rank", type=int, default=-1,
                        help="raise an error on this rank at step 10")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    generator = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(256, 4, generator=generator)
    y = x @ TRUE_WEIGHTS + TRUE_BIAS

    for step in range(1, args.steps + 1):
        if step == 10 and rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} fails on purpose at step {step}")
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if rank == 0 and (step == 1 or step % 50 == 0):
            print(f"step {step} loss {loss.item():.6f}", flush=True)

    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    print(f"final step={args.steps} loss={loss.item():.6f} "
          f"params_sha256={digest} rank={rank} world={world} "
          f"restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
