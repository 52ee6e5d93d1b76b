"""For warm-start tests: find ctrun's template interpreter from one of its
workers (a cold one or a warm one) and wait until it serves starts.

The template is the agent's child whose stdout is /dev/null; it serves
starts once its imports are done and it waits in recvmsg() on its socket.
"""
import os
import platform
import time

_RECVMSG = {"x86_64": "47", "aarch64": "212"}[platform.machine()]


def template_pid():
    """The template's pid, or None."""
    agent = str(os.getppid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % pid) as f:
                stat = f.read()
            out = os.readlink("/proc/%s/fd/1" % pid)
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == agent and out == "/dev/null":
            return int(pid)
    return None


def await_ready_template(limit=120.0):
    """The template's pid once it waits for a start (its imports done)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        pid = template_pid()
        try:
            with open("/proc/%d/syscall" % pid) as f:
                if f.read().split()[0] == _RECVMSG:
                    return pid
        except (OSError, TypeError):
            pass
        time.sleep(0.1)
    raise SystemExit("the template interpreter never became ready")
