"""In-process recovery: ctrun.resilient, ctrun.round, ctrun.RoundChanged.

Under `ctrun --recovery=inprocess`, a worker failure or a node change does
not stop the workers that still run. Their agent writes the new world to
each one's world file (CTRUN_WORLD_FILE): first "round N ends", then round
N+1's ranks, sizes and master. `resilient(fn)` watches that file from a
helper thread and, when the round ends while `fn` runs:

1. raises RoundChanged in the main thread (a signal handler: it ends a
   `time.sleep`, a Python loop, a wait), and if the main thread is still
   inside after a short while (blocked in a collective that a dead peer
   will never complete), shuts down the process's connected TCP sockets,
   which makes the collective fail at once;
2. once `fn` has returned control, destroys the process group, takes the
   new world into `os.environ`, forms the group again with the same
   backend (for a rank other than 0, once the new master listens) and
   calls `fn` again, with the same arguments: the model, the optimizer
   and whatever else the caller holds are still in memory.

An exception that `fn` raises while no new round comes (within
CTRUN_RECOVERY_GRACE seconds, 2 by default) is the worker's own failure:
it propagates as without the wrapper. Outside ctrun, without
--recovery=inprocess, or off the main thread, `resilient(fn)` just calls
`fn`.

A new process of a later round (a replacement) forms its group before it
reaches `resilient`: its `init_process_group` on env:// is released and
formed again in the same way when the round it forms in ends (another
failure meanwhile), instead of failing on the dead peer's sockets.
"""

import functools
import os
import signal
import socket
import threading
import time

_POLL = 0.005  # the world file, this often
_SWEEP_AFTER = 0.05  # a main thread still inside this long: break its sockets
# A main thread forming its group still inside this long after its release:
# blocked in native code for a peer of the old round (a Gloo pair waiting
# for a connection never comes); its agent starts it anew.
_STUCK_AFTER = 1.0
_MASTER_WAIT = 120.0  # the new master's store, at most this long
_FRESH_MASTER_WAIT = 60.0  # a fresh process's wait, before torch's own

# The _Recovery that runs in this process, if any: it, not the env://
# handler, moves the process between worlds.
_active = None


class RoundChanged(Exception):
    """Raised in a resilient function's main thread when its round ends."""


def round():  # noqa: A001 - the name DESIGN.md gives it
    """The job's round this worker runs in: 0 at the job's first start, then
    one more for every restart, lost node and new node, wherever the worker
    runs (a promoted spare's included); updated in place by resilient() and
    wait_for_slot(). TORCHELASTIC_RESTART_COUNT counts failures only (a lost
    node spends no restart), so it is the answer only outside ctrun."""
    for name in ("CTRUN_STORE_ROUND", "TORCHELASTIC_RESTART_COUNT"):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 0


def resilient(fn):
    """Runs fn(*args, **kwargs) and, under --recovery=inprocess, runs it
    again in each new world the job moves to; returns what fn returns.
    Usable as a decorator."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        path = os.environ.get("CTRUN_WORLD_FILE")
        if (
            os.environ.get("CTRUN_RECOVERY") != "inprocess"
            or not path
            or threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "SIGRTMIN")
        ):
            return fn(*args, **kwargs)
        return _Recovery(path).run(fn, args, kwargs)

    return run


def _read_world(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    world = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            world[key] = value
    try:
        world["CTRUN_ROUND"] = int(world["CTRUN_ROUND"])
    except (KeyError, ValueError):
        return None
    if world.get("CTRUN_ROUND_STATE") not in ("ending", "ready"):
        return None
    return world


def _sweep_sockets():
    """Shuts down every connected TCP socket of this process (never a
    listening one: shutting down a TCPStore's listener aborts the
    process). The collective blocked on one of them fails at once."""
    connected = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "01":  # ESTABLISHED
                        connected.add(fields[9])
        except OSError:
            pass
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if not (target.startswith("socket:[") and target[8:-1] in connected):
            continue
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.close()  # the duplicate only


def _abort_nccl():
    """Aborts the default group's NCCL communicators (ncclCommAbort), which
    ends a collective that waits on a dead peer; a socket sweep does not
    reach NCCL's transports. False when there is none to abort."""
    try:
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_backend() != "nccl":
            return False
        c10d = dist.distributed_c10d
        if hasattr(c10d, "_abort_process_group"):  # PyTorch >= 2.6
            c10d._abort_process_group()
            return True
        pg = c10d._get_default_group()
        backend = pg._get_backend(__import__("torch").device("cuda"))
        backend.abort()
        return True
    except Exception:
        return False


def _wait_listening(host, port, deadline):
    """A TCPStore client that arrives before its server listens retries only
    a second later: wait for the listener first (5 ms apart at first, never
    more than 100 ms apart, so that many waiting ranks stay cheap)."""
    pause = 0.005
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except socket.gaierror:
            return  # a name that does not resolve: torch's error says so
        except OSError:
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


def _take_newer_world():
    """A new process of an in-process round that is still starting when the
    next round comes is kept into it (it is resilient-to-be): as it forms
    its group, it takes the newest world from its world file, waiting while
    a round it was started for ends and the next one is decided. Not where
    a _Recovery moves the process (a survivor forming its group again)."""
    path = os.environ.get("CTRUN_WORLD_FILE")
    if os.environ.get("CTRUN_RECOVERY") != "inprocess" or not path or _active:
        return
    try:
        mine = int(os.environ.get("CTRUN_STORE_ROUND", "0"))
    except ValueError:
        return
    deadline = time.monotonic() + _MASTER_WAIT
    while True:
        world = _read_world(path)
        if world is None or world["CTRUN_ROUND"] < mine:
            return
        if world["CTRUN_ROUND_STATE"] == "ready":
            if world["CTRUN_ROUND"] > mine:
                for key, value in world.items():
                    if not key.startswith("CTRUN_ROUND"):
                        os.environ[key] = value
            return
        if time.monotonic() > deadline:  # the agent bounds the round
            return
        time.sleep(_POLL)


def _await_master(url, timeout):
    """In a ctrun worker of rank other than 0: until MASTER_ADDR:MASTER_PORT
    listens (at most `timeout`, a timedelta, and never over a minute; then
    torch's own connect takes over with its own timeout and errors)."""
    if os.environ.get("CTRUN_PROGRESS_PID") != str(os.getpid()):
        return  # not ctrun's worker (a forked child, a process outside ctrun)
    query = dict(
        item.partition("=")[::2] for item in url.partition("?")[2].split("&") if item
    )
    rank = query.get("rank", os.environ.get("RANK", ""))
    try:
        port = int(os.environ["MASTER_PORT"])
        host = os.environ["MASTER_ADDR"]
    except (KeyError, ValueError):
        return  # torch names what is missing
    if rank in ("0", "") or not host or not 0 < port < 65536:
        return  # rank 0 hosts the store; a bad port is torch's to name
    limit = _FRESH_MASTER_WAIT
    try:
        limit = min(limit, timeout.total_seconds())
    except AttributeError:
        pass
    _wait_listening(host, port, time.monotonic() + limit)


def _patch_env_rendezvous(module):
    """Has `module` (torch.distributed.rendezvous) wait for the master before
    env:// forms a store; once per module."""
    handlers = getattr(module, "_rendezvous_handlers", None)
    original = handlers.get("env") if isinstance(handlers, dict) else None
    if original is None or getattr(original, "_ctrun_waits", False):
        return

    @functools.wraps(original)
    def env_handler(url, **kwargs):
        try:
            if os.environ.get("CTRUN_PROGRESS_PID") == str(os.getpid()):
                _take_newer_world()
            _await_master(url, kwargs.get("timeout"))
        except RoundChanged:
            raise  # released: the round it forms in ended
        except Exception:  # the wait is an optimisation: never the failure
            pass
        return original(url, **kwargs)

    env_handler._ctrun_waits = True
    handlers["env"] = env_handler


def _forms_on_env(args, kwargs):
    """Whether init_process_group(*args, **kwargs) forms the default group
    through env://, the store of the world file's master."""
    if len(args) > 1 or kwargs.get("store") is not None:
        return False
    return kwargs.get("init_method") in (None, "env://")


def _patch_init(module):
    """Has `module` (torch.distributed) form the default group of a new
    process of an in-process round as resilient() would: released and
    formed again in the next world when the round ends meanwhile; once per
    module, its distributed_c10d's name included."""
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "_ctrun_forms", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        path = os.environ.get("CTRUN_WORLD_FILE")
        if (
            _active is not None  # resilient() forms it, or fn does
            or os.environ.get("CTRUN_RECOVERY") != "inprocess"
            or not path
            or os.environ.get("CTRUN_PROGRESS_PID") != str(os.getpid())
            or threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "SIGRTMIN")
            or not _forms_on_env(args, kwargs)
        ):
            return original(*args, **kwargs)
        return _Recovery(path, forming=True).run(original, args, kwargs)

    init_process_group._ctrun_forms = True
    module.init_process_group = init_process_group
    c10d = getattr(module, "distributed_c10d", None)
    if getattr(c10d, "init_process_group", None) is original:
        c10d.init_process_group = init_process_group


class _TorchFinder:
    """Patches torch.distributed.rendezvous and torch.distributed as they
    are imported; finds nothing else (every other import goes on down
    sys.meta_path)."""

    _PATCHES = {
        "torch.distributed.rendezvous": _patch_env_rendezvous,
        "torch.distributed": _patch_init,
    }

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        patch = cls._PATCHES.get(name)
        if patch is None:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None  # whoever comes next imports it, unpatched
        run = loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


def _install_master_wait():
    """A fresh worker (a replacement, a spare's, a warm start) can reach
    init_process_group before rank 0's TCPStore listens, above all in a
    round where rank 0 kept its process and forms its store anew; torch's
    client then retries only a second later. Under ctrun, env:// waits for
    the listener first. And a new process of an in-process round forms its
    group as resilient() would (see _patch_init)."""
    import sys

    missing = False
    for name, patch in _TorchFinder._PATCHES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            missing = True
    if missing and _TorchFinder not in sys.meta_path:
        sys.meta_path.insert(0, _TorchFinder)


def _forget_unformed_group(dist):
    """An init released half-way (a second failure while the group formed
    again) leaves torch counting a group that never formed; the next one
    would take the next group's name, and its store keys would never meet
    those of the ranks that start afresh. destroy_process_group resets the
    count, and there is no group to destroy: reset it here."""
    c10d = getattr(dist, "distributed_c10d", None)
    world = getattr(c10d, "_world", None)
    if world is not None and hasattr(world, "group_count"):  # torch >= 2.0
        world.group_count = 0
    elif hasattr(c10d, "_group_count"):
        c10d._group_count = 0


class _Recovery:
    """Runs fn in the world of the world file at `path`, and again in each
    newer one. forming: fn is init_process_group itself (a new process
    forming its group): nothing to form around it, and the worker is not
    marked resilient by it."""

    def __init__(self, path, forming=False):
        from . import _mark_resilient, _mark_round, _mark_stuck

        self._path = path
        self._forming = forming
        self._mark_round = _mark_round
        self._mark_stuck = _mark_stuck
        self._formation = False  # the main thread forms the group
        try:
            self._round = int(os.environ.get("CTRUN_STORE_ROUND", "0"))
        except ValueError:
            self._round = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._inside = False  # the main thread runs fn (or forms the group)
        self._released = False  # it was told to leave this round
        self._entries = 0  # times the main thread went inside
        self._latest = None  # the newest world file read, if newer
        self._signal = int(signal.SIGRTMIN) + 7
        self._previous = signal.signal(self._signal, self._on_signal)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ctrun-recovery", daemon=True)
        self._thread.start()
        if not forming:
            _mark_resilient()
        _mark_round(0, self._round)

    # --- the helper thread ------------------------------------------------

    def _watch(self):
        stamp = None
        while not self._done.wait(_POLL):
            try:
                st = os.stat(self._path)
            except OSError:
                continue
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key == stamp:
                continue
            stamp = key
            world = _read_world(self._path)
            if world is None:
                continue
            with self._lock:
                r = world["CTRUN_ROUND"]
                if r < self._round or (
                    r == self._round and world["CTRUN_ROUND_STATE"] == "ready"
                ):
                    continue  # the round it runs in, or older
                self._latest = world
                self._changed.notify_all()
            self._release()

    def _release(self):
        main = threading.main_thread().ident
        with self._lock:
            # Only for a world the main thread has not taken yet, and once
            # per entry into `fn`.
            if not self._inside or self._released or self._latest is None:
                return
            self._released = True
            entry = self._entries
            signal.pthread_kill(main, self._signal)
        aborted = stuck = False
        released = time.monotonic()
        try:
            while not self._done.wait(_SWEEP_AFTER):
                with self._lock:
                    # Still inside the same entry: blocked where no signal
                    # reaches (a collective waiting for a dead peer), or
                    # where the exception was swallowed and it went on to
                    # connect again: until it leaves, every socket it holds
                    # is the old round's. Never once it has left: they
                    # would be the new round's.
                    if not (self._inside and self._entries == entry):
                        return
                    if aborted or not _abort_nccl():
                        _sweep_sockets()
                    aborted = True
                    # Only while forming: a long native call in fn (a
                    # checkpoint's write) ends on its own, with the state.
                    if (
                        not stuck
                        and self._formation
                        and time.monotonic() - released > _STUCK_AFTER
                    ):
                        stuck = True
                        self._mark_stuck(True)
        finally:
            if stuck:
                self._mark_stuck(False)

    def _on_signal(self, signum, frame):
        if self._inside and self._released:
            raise RoundChanged("the job moved to a new round")

    # --- the main thread ----------------------------------------------------

    def _newer(self):
        return self._latest is not None

    def run(self, fn, args, kwargs):
        global _active
        outer, _active = _active, self
        try:
            return self._run(fn, args, kwargs)
        finally:
            # Nothing of this call outlives it: a later resilient call
            # watches afresh.
            _active = outer
            self._done.set()
            self._thread.join()
            previous = self._previous
            signal.signal(self._signal, signal.SIG_DFL if previous is None else previous)

    def _run(self, fn, args, kwargs):
        reform = None  # the backend to form again, once in a new round
        options = {}  # and init_process_group's options for it
        if self._forming:
            # fn is init_process_group: from round 1 on, the group is formed
            # as the kept ranks form it (_form), with the caller's backend
            # and options; its own world's variables are the world file's.
            # None: torch's default backend (torch >= 2.0).
            reform = args[0] if args else kwargs.get("backend")
            options = {
                k: v
                for k, v in kwargs.items()
                if k not in ("backend", "init_method", "store", "rank", "world_size")
            }
        while True:
            try:
                with self._lock:
                    if self._newer():
                        raise RoundChanged("the job moved to a new round")
                    self._inside = True
                    self._released = False
                    self._entries += 1
                self._formation = self._forming or reform is not None
                if self._forming and self._round == 0:
                    result = fn(*args, **kwargs)  # torch's env://, as is
                elif self._forming:
                    result = self._form(reform, options)
                else:
                    if reform is not None:
                        self._form(reform, options)
                    self._formation = False
                    self._mark_round(1, self._round)
                    result = fn(*args, **kwargs)
                with self._lock:
                    self._inside = False
                    self._formation = False
                if self._forming:
                    self._mark_round(1, self._round)
                return result
            except BaseException as error:
                with self._lock:
                    self._inside = False
                    self._formation = False
                world = self._next_world(error)
                # Released while it formed the group again (a second
                # failure then): there is no group to tell the backend, so
                # the one it was forming is formed in the next world.
                reform = self._leave(world) or reform

    def _next_world(self, error):
        """The next round's world; re-raises `error` when none comes."""
        grace = 2.0
        try:
            grace = float(os.environ.get("CTRUN_RECOVERY_GRACE", grace))
        except ValueError:
            pass
        deadline = time.monotonic() + grace
        with self._lock:
            # A round change makes the old group fail; a failure of this
            # rank's own is said by the agent within the grace, or never.
            while self._latest is None:
                if isinstance(error, (KeyboardInterrupt, SystemExit)):
                    raise error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise error
                self._changed.wait(left)
            # Ending: the agent bounds the wait (--recovery_timeout).
            while self._latest["CTRUN_ROUND_STATE"] != "ready":
                self._changed.wait()
            world, self._latest = self._latest, None
            self._round = world["CTRUN_ROUND"]
            return world

    def _leave(self, world):
        backend = None
        try:
            import torch.distributed as dist
        except ImportError:
            dist = None
        if dist is not None and dist.is_available() and dist.is_initialized():
            backend = dist.get_backend()
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        elif dist is not None and dist.is_available():
            _forget_unformed_group(dist)
        for key, value in world.items():
            if not key.startswith("CTRUN_ROUND"):
                os.environ[key] = value
        self._mark_round(0, self._round)
        return backend or ""

    def _form(self, backend, options):
        """Forms the default group of this round's world: over rank 0's
        TCPStore on MASTER_ADDR:MASTER_PORT, under a prefix of the round's
        own, so that nothing a rank wrote while it formed an earlier round's
        group (on the same port, with a fixed --master_port) is read. ""
        (no group before): nothing to form."""
        if backend == "":
            return None
        import torch.distributed as dist
        from datetime import timedelta

        options = dict(options)
        timeout = options.pop(
            "timeout", getattr(dist, "default_pg_timeout", timedelta(minutes=30))
        )
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        if rank != 0:
            _wait_listening(host, port, time.monotonic() + _MASTER_WAIT)
        # torch's env:// store on rank 0 waits for the other ranks without
        # letting go of the GIL: a rank dying meanwhile (a second failure
        # while the group forms again) would leave this process where its
        # recovery thread cannot release it. A store that does not wait
        # leaves the wait to the backend's own rendezvous, which lets go of
        # the GIL and fails once its sockets are swept.
        store = dist.TCPStore(host, port, world, rank == 0, timeout, wait_for_workers=False)
        prefixed = dist.PrefixStore("ctrun/round/%d/default_pg" % self._round, store)
        return dist.init_process_group(
            backend, store=prefixed, rank=rank, world_size=world, timeout=timeout, **options
        )
