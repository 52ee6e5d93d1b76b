# torchrun's file timers, used as under torchrun: rank 1's "slow_io" scope
# expires and ctrun kills it with SIGTERM.
import os
import signal
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires

configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal=signal.SIGTERM))
rank = int(os.environ["RANK"])
with expires(after=30, scope="quick"):
    pass
if rank == 1:
    with expires(after=1, scope="slow_io"):
        time.sleep(60)
    print("rank 1 outlived its timer", flush=True)
else:
    time.sleep(20)
print(f"rank {rank} done", flush=True)
