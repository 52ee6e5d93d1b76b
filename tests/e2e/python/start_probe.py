"""What a worker sees of how it was started, for warm-against-cold tests.

Prints one line "probe {json}": whether `wave` was imported before the
script ran (a warm start preloading it), argv, __file__, sys.path[0], the
working directory, a few variables, signal dispositions and mask, whether
the worker leads its own process group and whether its parent is the
agent, its /proc/self/cmdline, comm and a few variables of
/proc/self/environ (what ps and pgrep read); then "fds [...]": what its descriptors above 2 point to. Then, by
argv: "exit N" exits N on rank 1, "raise" raises on rank 1,
"term" has rank 1 SIGTERM itself, "child" starts `sleep 300` and waits.
"""
import sys

WARM = "wave" in sys.modules

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

agent = os.environ.get("CTRUN_PROGRESS_FILE", "/proc/0/").split("/")[2]
probe = {
    "warm": WARM,
    "argv": sys.argv,
    "file": __file__,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "name": __name__,
    "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PROBE_VAR")},
    "signals": {
        name: str(signal.getsignal(getattr(signal, name)))
        for name in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGUSR1", "SIGCHLD")
    },
    "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "own_group": os.getpgid(0) == os.getpid(),
    "parent_is_agent": str(os.getppid()) == agent,
    "stdout_tty": sys.stdout.isatty(),
    # What ps, top and pgrep read of it.
    "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\0"),
    "comm": open("/proc/self/comm").read().strip(),
    "orig_argv": getattr(sys, "orig_argv", None),
    "environ": sorted(
        item
        for item in open("/proc/self/environ", "rb").read().decode().split("\0")
        if item.split("=")[0] in ("RANK", "LOCAL_RANK", "PROBE_VAR")
    ),
}
print("probe " + json.dumps(probe, sort_keys=True), flush=True)
fds = []
for fd in os.listdir("/proc/self/fd"):
    try:
        fds.append(os.readlink("/proc/self/fd/" + fd) if int(fd) > 2 else None)
    except OSError:  # the listing's own descriptor, closed by now
        pass
print("fds " + json.dumps(sorted(f for f in fds if f)), flush=True)
rank = os.environ.get("RANK")
what = sys.argv[1] if len(sys.argv) > 1 else ""
if rank == "1" and what == "exit":
    sys.exit(int(sys.argv[2]))
if rank == "1" and what == "raise":
    raise ValueError("rank 1 raises on purpose")
if rank == "1" and what == "term":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
if what == "child":
    child = subprocess.Popen(["sleep", "300"])
    print("child %d of %d" % (child.pid, os.getpid()), flush=True)
    child.wait()
