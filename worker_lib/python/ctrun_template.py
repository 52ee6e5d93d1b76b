"""ctrun's template interpreter: warm starts of Python workers.

The agent starts this once per node (`python -u ctrun_template.py FD
MODULES [optional]`) with the workers' environment. It imports MODULES
(torch, say) once, then, for each worker the agent asks for, forks a
process that runs the worker's script as `__main__`, as `python -u SCRIPT
ARGS` would, without paying the imports again.

FD is a SOCK_SEQPACKET socket to the agent. The template says "ready N" (N:
its threads) or "refuse WHY" once, then answers each request with "pid P"
or "error WHY". A request is NUL-separated fields:
    own_group, agent_pgid, agent_pid, cwd, argc, argv..., envc, env...
with the worker's stdout and stderr as SCM_RIGHTS. argv is the worker's
command line without the interpreter and its -u: SCRIPT ARGS... or -m
MODULE ARGS...

The worker is the template's grandchild: its parent exits at once, so the
worker is reparented to the agent (a child subreaper), which reaps it as
any worker. It reads as a cold start would: /proc/PID/cmdline (what ps,
top and pgrep -f show) and /proc/PID/environ are its own command line and
environment, not the template's (PR_SET_MM_MAP, which Linux lets a
process do to itself; where refused they stay the template's).

The template's own stdout and stderr go to /dev/null (the agent reads
neither): a preloaded module that prints as it loads must not break it.
"""

import ctypes
import os
import signal
import socket
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_PTRACER = 0x59616D61
_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
# How long a worker waits to be handed to the agent: its middle parent's
# exit tears down a copy of the template's address space, which takes a
# while for a template of gigabytes.
_HANDOVER_WITHIN = 60.0


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _unsafe():
    """Why forking this interpreter would not give a sound worker, or ''."""
    threads = _threads()
    if threads > 1:
        return "the template runs %d threads after its imports" % threads
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "the template created a CUDA context while importing"
    return ""


def _preload(modules, optional):
    for name in modules:
        if not name:
            continue
        try:
            __import__(name)
        except ImportError as error:
            if not optional:
                return "cannot import %s: %s" % (name, error)
        except BaseException as error:  # a module that fails as it loads
            return "importing %s failed: %s: %s" % (name, type(error).__name__, error)
    return ""


class _MmMap(ctypes.Structure):
    """struct prctl_mm_map (linux/prctl.h)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "start_code", "end_code", "start_data", "end_data", "start_brk",
            "brk", "start_stack", "arg_start", "arg_end", "env_start",
            "env_end", "auxv",
        )
    ] + [("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


# The blocks /proc/PID/cmdline and environ read from once retitled: they
# must live as long as the process.
_title = []


def _retitle(libc, argv, env):
    """Points the kernel's view of this process's command line and
    environment at `argv` and `env` ("KEY=VALUE"), keeping every other
    field of its memory map as it is. False where the kernel refuses (no
    checkpoint/restore support, a seccomp filter)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        field = lambda n: int(fields[n - 3])  # noqa: E731 - proc(5)'s numbering
        args, environ = (
            b"".join(os.fsencode(item) + b"\0" for item in items) for items in (argv, env)
        )
        # +1: an empty environment still needs an address.
        blocks = [ctypes.create_string_buffer(b, len(b) + 1) for b in (args, environ)]
        libc.sbrk.restype = ctypes.c_void_p
        mm = _MmMap(
            start_code=field(26), end_code=field(27), start_stack=field(28),
            start_data=field(45), end_data=field(46), start_brk=field(47),
            brk=libc.sbrk(0),
            arg_start=ctypes.addressof(blocks[0]),
            arg_end=ctypes.addressof(blocks[0]) + len(args),
            env_start=ctypes.addressof(blocks[1]),
            env_end=ctypes.addressof(blocks[1]) + len(environ),
            auxv=0, auxv_size=0, exe_fd=0xFFFFFFFF,  # neither changed
        )
        if libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0):
            return False
        _title.extend(blocks)
        return True
    except (OSError, ValueError, IndexError, AttributeError):
        return False


def _become(fields, fds, agent):
    """In the worker: its process group, descriptors, parent-death signal,
    environment, directory and argv; then its script. Never returns."""
    own_group, agent_pgid, cwd = fields[0] == "1", int(fields[1]), fields[3]
    agent = int(fields[2]) or agent
    argc = int(fields[4])
    argv = fields[5 : 5 + argc]
    envc = int(fields[5 + argc])
    env = fields[6 + argc : 6 + argc + envc]
    os.setpgid(0, 0 if own_group else agent_pgid)
    libc = ctypes.CDLL(None, use_errno=True)
    _await_agent(agent)
    libc.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != agent:  # the agent died since: as its signal would
        os.kill(os.getpid(), signal.SIGKILL)
    libc.prctl(_PR_SET_PTRACER, agent, 0, 0, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    for item in env:
        key, _, value = item.partition("=")
        os.environ[key] = value
    # As `python -u ARGV...` exec'd with this environment would read.
    interpreter = list(getattr(sys, "orig_argv", [sys.executable, "-u"])[:2])
    _retitle(libc, interpreter + argv, env)
    sys.orig_argv = interpreter + argv
    # ctrun's module attached to nothing in the template: this worker's
    # slot and stacks file come with a fresh import.
    for name in [m for m in sys.modules if m == "ctrun" or m.startswith("ctrun.")]:
        del sys.modules[name]
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()  # as fresh as a cold start's
    try:
        import ctrun  # noqa: F401
    except Exception:
        pass
    _run(argv)


def _await_agent(agent):
    """Returns once this process is the agent's child: reparented to it (a
    subreaper) as the middle parent's exit completes; only then is a
    parent-death signal the agent's. The exit of a parent holding gigabytes
    takes a while, so the wait is bounded by time, yielding at first and
    then sleeping. A worker that is never handed over (the agent is gone, or
    the middle parent never ends) dies by SIGKILL, as the agent's death
    would have ended it: never with an exit code that reads as its script's
    error."""
    middle = os.getppid()
    start = time.monotonic()
    while True:
        parent = os.getppid()
        if parent == agent:
            return
        waited = time.monotonic() - start
        if parent != middle or waited > _HANDOVER_WITHIN:
            os.kill(os.getpid(), signal.SIGKILL)
        if waited < 0.01:
            os.sched_yield()
        else:
            time.sleep(min(waited / 10, 0.01))


def _trimmed(tb):
    here = os.path.abspath(__file__)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    return tb


def _run(argv):
    """Runs argv as `python -u` would, then exits as it would."""
    import runpy

    if argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        target = lambda: runpy._run_module_as_main(argv[1], alter_argv=True)  # noqa: E731
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        target = lambda: _run_script(script)  # noqa: E731
    try:
        target()
    except SystemExit:
        raise
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        # The exception's own traceback is what gets printed: trim it.
        error.__traceback__ = _trimmed(error.__traceback__)
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)
    sys.exit(0)


def _run_script(script):
    import builtins
    import importlib.machinery
    import types

    path = os.path.abspath(script)
    with open(path, "rb") as f:
        source = f.read()
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__spec__ = None
    main.__cached__ = None
    sys.modules["__main__"] = main
    exec(compile(source, path, "exec"), main.__dict__)


def _serve(sock, agent):
    """Answers requests until the agent goes; returns, in a worker, what it
    was asked to run."""
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 22, 2)
        except InterruptedError:
            continue
        if not message:
            os._exit(0)  # the agent is gone
        fields = message.decode("utf-8", "surrogateescape").split("\0")
        why = _unsafe()
        if why or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            sock.send(("error " + (why or "no output descriptors")).encode())
            continue
        answer = _fork(fds)
        if answer is None:  # this process is the worker
            sock.close()
            return fields, fds
        sock.send(answer.encode())


def _fork(fds):
    """Forks the worker through a middle process that exits at once; returns
    its answer in the template, None in the worker."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(read_end)
        try:
            worker = os.fork()
        except OSError:
            os._exit(1)
        if worker == 0:
            os.close(write_end)
            return None
        os.write(write_end, str(worker).encode())
        os._exit(0)
    os.close(write_end)
    for fd in fds:
        os.close(fd)
    pid = os.read(read_end, 32).decode()
    os.close(read_end)
    os.waitpid(middle, 0)
    return "pid " + pid if pid.isdigit() else "error the fork failed"


def main():
    # Whatever the imports print goes nowhere, and never breaks them.
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    sock = socket.socket(fileno=int(sys.argv[1]))
    agent = os.getppid()
    why = _preload(sys.argv[2].split(","), len(sys.argv) > 3 and sys.argv[3] == "optional")
    why = why or _unsafe()
    if why:
        sock.send(("refuse " + why).encode())
        return
    sock.send(("ready %d" % _threads()).encode())
    fields, fds = _serve(sock, agent)
    # At the top of the stack: the script's exit is the process's.
    _become(fields, fds, agent)


if __name__ == "__main__":
    main()
