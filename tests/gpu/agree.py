"""What every GPU check script ends with: each rank hashes its parameters,
and rank 0 says whether all ranks agree.

    ok NAME ranks=2 agree=yes loss=0.0012 devices=cuda:0,cuda:1
"""
import hashlib
import os

import torch
import torch.distributed as dist


def report(name, module, loss):
    digest = hashlib.sha256()
    for p in module.parameters():
        digest.update(p.detach().float().cpu().numpy().tobytes())
    mine = (digest.hexdigest(), str(next(module.parameters()).device))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        agree = len({d for d, _ in everyone}) == 1
        devices = ",".join(dev for _, dev in everyone)
        print(f"ok {name} ranks={len(everyone)} agree={'yes' if agree else 'no'} "
              f"loss={float(loss):.6g} devices={devices}", flush=True)
    expected = f"cuda:{os.environ['LOCAL_RANK']}"
    if mine[1] != expected:
        print(f"rank {dist.get_rank()}: parameters on {mine[1]}, expected "
              f"{expected} (LOCAL_RANK)", flush=True)
        raise SystemExit(1)
