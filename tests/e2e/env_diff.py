"""Compares the worker environments that tests/e2e/env_dump.py wrote under
torchrun (first folder) and ctrun (second), rank by rank, and prints one
line per difference. Exits 1 when a difference is not explained: a
torchrun variable ctrun lacks or sets otherwise, or a variable of ctrun's
that is neither its own nor torchrun's.

    env_diff.py TORCHRUN_DUMPS CTRUN_DUMPS
"""
import json
import os
import sys

# Different by nature: ports, run ids, per-run files; ctrun names the
# loopback address it listens on where torchrun says "localhost".
BY_NATURE = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
             "MASTER_ADDR", "_"}


def ours(key):
    return (key.startswith("CTRUN_") or key.startswith("TORCH_NCCL_")
            or key == "PYTHONPATH")


def load(folder):
    return {f[:-5]: json.load(open(os.path.join(folder, f)))
            for f in os.listdir(folder) if f.endswith(".json")}


torchrun, ctrun = load(sys.argv[1]), load(sys.argv[2])
unexplained = 0
if sorted(torchrun) != sorted(ctrun) or not torchrun:
    print(f"ranks differ: torchrun {sorted(torchrun)}, ctrun {sorted(ctrun)}")
    sys.exit(1)
for rank in sorted(torchrun):
    t, c = torchrun[rank], ctrun[rank]
    for key in sorted(set(t) | set(c)):
        if key in t and key not in c:
            print(f"rank {rank}: {key}={t[key]} under torchrun, unset under ctrun")
            unexplained += 1
        elif key in c and key not in t:
            if not ours(key):
                print(f"rank {rank}: {key}={c[key]} under ctrun only")
                unexplained += 1
        elif t[key] != c[key]:
            note = " (by nature)" if key in BY_NATURE else ""
            print(f"rank {rank}: {key}: torchrun {t[key]!r}, ctrun {c[key]!r}{note}")
            unexplained += key not in BY_NATURE
print(f"{unexplained} unexplained difference(s) over {len(torchrun)} rank(s)")
sys.exit(1 if unexplained else 0)
