"""Progress signals from a worker to its ctrun agent.

ctrun puts this module on its workers' PYTHONPATH, so nothing needs to be
installed:

    import ctrun

    for step in range(steps):
        ctrun.heartbeat()                  # once per step
        with ctrun.section("compute"):     # a rank's own work
            loss = model(batch).sum()
            loss.backward()
        optimizer.step()
        if step % 1000 == 0:
            with ctrun.section("checkpoint", untimed=True):
                save(model)
    ctrun.done()  # the loop is over: what follows is not timed

Each call writes a few numbers into memory shared with the agent (the
layout is ctrun/progress_board.h in libctrun_worker): no system call, no
lock, nothing that can block. Outside ctrun, in processes forked from the
worker (DataLoader workers) and in its Python children (multiprocessing's
spawn, a subprocess), every function does nothing.

Installed from the wheel (pip install ctrun), the same module is importable
outside ctrun too, `python -m ctrun ...` runs ctrun, and
cmake_prefix_path() finds libctrun_worker for C++ trainers.

Under ctrun, importing the module also registers faulthandler on a spare
real-time signal, so that the agent can take every thread's Python stack
from a hung worker before it is stopped; and has torch's env:// init of a
rank other than 0 wait until MASTER_ADDR:MASTER_PORT listens (torch's
store client would retry only a second later: a fresh replacement often
arrives before a kept rank 0 has formed its new store).
"""

import atexit
import faulthandler
import mmap
import os
import signal
import struct
import time

__all__ = [
    "heartbeat",
    "section",
    "done",
    "reported",
    "should_stop",
    "preempted",
    "resilient",
    "round",
    "RoundChanged",
    "wait_for_slot",
    "cmake_prefix_path",
]

_MAGIC = b"CTRUNPB3"
_HEADER = 64
_SLOT = 128
_NAME = 32
# Slot flags.
_UNTIMED = 1
_STACKS_ON_SIGNAL = 2
_DONE_FLAG = 4
_RESILIENT = 8
_STOP_AWARE = 32
_HELD = 64
_STUCK = 128
# Header: the coordinated stop the agent posts (ctrun --preemption_grace).
_STOP_STATE_OFFSET = 16  # u32
_STOP_STEP_OFFSET = 24  # i64
_STOP_REASON_OFFSET = 32  # char[32]
_STOP_OFF, _STOP_IDLE, _STOP_HOLD, _STOP_AT, _STOP_FALLBACK = range(5)
# A preemption signal delivered to the worker itself (Slurm signals every
# process of a step) that the agent has not taken up this long after acts.
_UNCLAIMED_AFTER = 1.0

# Word offsets in a slot (8-byte words).
_SEQ, _BEATS, _BEAT_NS, _EVENTS, _EVENT_NS, _BUSY_NS, _SECTIONS_DONE = range(7)
_FLAGS_OFFSET = 56
_ROUNDS_OFFSET = 64  # u32 round_left, u32 round_ready
_ROUND_TIMES = 9  # word: i64 left_ns, then i64 ready_ns
_NAME_OFFSET = 88
_OWNER_OFFSET = 120  # i32: the pid that took the slot last

_words = None  # memoryview of the board as signed 64-bit words
_map = None
_base = 0  # this slot's first word
_offset = 0  # this slot's first byte
_sections = []  # (name, untimed, start_ns), outermost first
_stacks_file = None
_checking = False  # should_stop() was called: the slot says so
_held_back = []  # (signal, monotonic time) held back by the stop check
_now = time.monotonic_ns  # CLOCK_MONOTONIC, as the agent reads it


def reported():
    """Whether this process reports to a ctrun agent."""
    return _words is not None


def done():
    """No more progress signals from this worker: what follows (a final
    checkpoint, tearing down, exiting) is not timed. Called by itself at
    exit; call it once the training loop is over."""
    if _map is None:
        return
    # A process that took the slot after this one reports for it now.
    if struct.unpack_from("<i", _map, _offset + _OWNER_OFFSET)[0] != os.getpid():
        return
    flags, sig = struct.unpack_from("<II", _map, _offset + _FLAGS_OFFSET)
    struct.pack_into("<II", _map, _offset + _FLAGS_OFFSET, flags | _DONE_FLAG, sig)


def heartbeat():
    """One step done."""
    w = _words
    if w is None:
        return
    now = _now()
    b = _base
    w[b + _BEAT_NS] = now
    w[b + _EVENT_NS] = now
    w[b + _BEATS] += 1
    w[b + _EVENTS] += 1


class section:
    """A named stretch of work: `with ctrun.section("step"):`.

    untimed=True (a checkpoint, an evaluation of unknown length): no hang
    timeout runs while it is open. Sections belong to the process: open and
    close them on one thread, innermost first.
    """

    __slots__ = ("_name", "_untimed")

    def __init__(self, name, untimed=False):
        self._name = str(name)
        self._untimed = bool(untimed)

    def __enter__(self):
        if _words is not None:
            _sections.append((self._name, self._untimed, _now()))
            _publish()
        return self

    def __exit__(self, *exc):
        if _words is not None and _sections:
            _, _, start = _sections.pop()
            now = _now()
            if not _sections:
                _words[_base + _BUSY_NS] += now - start
                _words[_base + _SECTIONS_DONE] += 1
            _publish(now)
        return False


def _publish(now=None):
    """The innermost open section, as one event, under the slot's seqlock."""
    w, b, m = _words, _base, _map
    if now is None:
        now = _now()
    name, untimed = (_sections[-1][0], _sections[-1][1]) if _sections else ("", False)
    raw = name.encode("utf-8", "replace")[: _NAME - 1].ljust(_NAME, b"\0")
    w[b + _SEQ] += 1
    m[_offset + _NAME_OFFSET : _offset + _NAME_OFFSET + _NAME] = raw
    flags, sig = struct.unpack_from("<II", m, _offset + _FLAGS_OFFSET)
    flags = (flags & ~_UNTIMED) | (_UNTIMED if untimed else 0)
    struct.pack_into("<II", m, _offset + _FLAGS_OFFSET, flags, sig)
    w[b + _EVENT_NS] = now
    w[b + _EVENTS] += 1
    w[b + _SEQ] += 1


def should_stop():
    """Whether this rank is to stop now: call it once per step, after
    ctrun.heartbeat(). When ctrun receives SIGTERM, SIGUSR1 or SIGUSR2
    (a scheduler's preemption), the whole job agrees on one step, and this
    returns True on every rank once it has made that many heartbeats: save
    a checkpoint there and exit 0. While the step is being agreed on (a
    few milliseconds), this call waits. A preemption signal delivered to
    the worker itself is held back for the agreed stop, and acts as usual
    if none comes (ctrun --preemption_grace). Returns False outside ctrun."""
    if _map is None:
        return False
    if not _checking:
        _start_checking()
    state = _stop_state()
    if state == _STOP_HOLD:
        _mark(_HELD, True)
        try:
            while state == _STOP_HOLD:
                time.sleep(0.001)
                state = _stop_state()
        finally:
            _mark(_HELD, False)
    if state == _STOP_AT:
        (step,) = struct.unpack_from("<q", _map, _STOP_STEP_OFFSET)
        return _words[_base + _BEATS] >= step
    if _held_back and (
        state in (_STOP_OFF, _STOP_FALLBACK)
        or time.monotonic() - _held_back[0][1] > _UNCLAIMED_AFTER
    ):
        _act(_held_back[0][0])
    return False


def preempted():
    """Why the job is stopping ("SIGTERM to ctrun on HOST"), or None when
    no stop was asked."""
    if _map is None or _stop_state() not in (_STOP_HOLD, _STOP_AT):
        return None
    raw = bytes(_map[_STOP_REASON_OFFSET : _STOP_REASON_OFFSET + 32])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _stop_state():
    return struct.unpack_from("<I", _map, _STOP_STATE_OFFSET)[0]


def _mark(flag, on):
    flags, sig = struct.unpack_from("<II", _map, _offset + _FLAGS_OFFSET)
    flags = (flags | flag) if on else (flags & ~flag)
    struct.pack_into("<II", _map, _offset + _FLAGS_OFFSET, flags, sig)


def _start_checking():
    """The slot says that this worker calls the stop check; preemption
    signals that would end it are held back for the agreed stop."""
    global _checking
    _checking = True
    _mark(_STOP_AWARE, True)
    if _stop_state() == _STOP_OFF:
        return
    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2"):
        sig = getattr(signal, name, None)
        try:
            if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, _on_preemption_signal)
        except ValueError:  # not the main thread: signals act as usual
            pass


def _on_preemption_signal(signum, frame):
    if _map is None or _stop_state() in (_STOP_OFF, _STOP_FALLBACK):
        _act(signum)
    else:
        _held_back.append((signum, time.monotonic()))


def _act(signum):
    """The signal acts as it would have without the stop check."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _mark_resilient():
    """The slot says that this worker recovers in process."""
    if _map is None:
        return
    flags, sig = struct.unpack_from("<II", _map, _offset + _FLAGS_OFFSET)
    struct.pack_into("<II", _map, _offset + _FLAGS_OFFSET, flags | _RESILIENT, sig)


def _mark_round(which, round_number):
    """which 0: the worker took round_number's world; 1: its communicator is
    formed again. Stored as 1 + the round (0: none)."""
    if _map is not None:
        _words[_base + _ROUND_TIMES + which] = _now()
        struct.pack_into("<I", _map, _offset + _ROUNDS_OFFSET + 4 * which, round_number + 1)


def _mark_stuck(on):
    """The slot says that this worker, released while it formed its
    group, cannot leave: the agent starts it anew."""
    if _map is not None:
        _mark(_STUCK, on)


def _forget():
    # A forked child is not the worker: its calls must not count.
    global _words, _map
    _words = None
    _map = None


def _register_stacks():
    """faulthandler on a spare real-time signal, appending to the worker's
    stacks file; the slot says which signal, so that the agent never sends
    it to a process that would die of it."""
    global _stacks_file
    path = os.environ.get("CTRUN_STACKS_FILE")
    if not path or not hasattr(signal, "SIGRTMIN"):
        return
    sig = int(signal.SIGRTMIN) + 6
    _stacks_file = open(path, "a")
    # Ignored before faulthandler takes it: faulthandler gives the signal
    # back to its previous handler as the interpreter exits, and a request
    # for stacks that comes then must not kill the worker.
    signal.signal(sig, signal.SIG_IGN)
    faulthandler.register(sig, file=_stacks_file, all_threads=True, chain=False)
    flags, _ = struct.unpack_from("<II", _map, _offset + _FLAGS_OFFSET)
    struct.pack_into("<II", _map, _offset + _FLAGS_OFFSET, flags | _STACKS_ON_SIGNAL, sig)


def _attach():
    global _words, _map, _base, _offset
    path = os.environ.get("CTRUN_PROGRESS_FILE")
    slot = os.environ.get("CTRUN_PROGRESS_SLOT")
    if not path or slot is None or not slot.isdigit():
        return
    index = int(slot)
    # A Python child of the worker (multiprocessing's spawn or forkserver, a
    # subprocess) inherits the slot's variables; the slot is its parent's.
    owner = os.environ.get("CTRUN_PROGRESS_PID")
    if owner is not None and owner != str(os.getpid()):
        return
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < _HEADER + (index + 1) * _SLOT:
            return
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    count, slot_size = struct.unpack_from("<II", m, 8)
    if m[:8] != _MAGIC or slot_size != _SLOT or index >= count:
        m.close()
        return
    _map = m
    os.environ["CTRUN_PROGRESS_PID"] = str(os.getpid())
    _offset = _HEADER + index * _SLOT
    # This process reports now: a done said by one before it (a wrapper's
    # earlier command) is taken back.
    struct.pack_into("<i", m, _offset + _OWNER_OFFSET, os.getpid())
    flags, sig = struct.unpack_from("<II", m, _offset + _FLAGS_OFFSET)
    struct.pack_into("<II", m, _offset + _FLAGS_OFFSET, flags & ~_DONE_FLAG, sig)
    _base = _offset // 8
    _words = memoryview(m).cast("q")
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget)
    atexit.register(done)  # exiting is not a step
    try:
        _register_stacks()
    except Exception:  # progress signals work without stacks
        pass


try:
    _attach()
except Exception:  # a worker must never fail because of its progress signals
    _forget()

from ._recovery import RoundChanged, resilient, round  # noqa: E402

if _words is not None:
    try:
        from ._recovery import _install_master_wait

        _install_master_wait()
    except Exception:  # torch's own retry is the fallback
        pass


def wait_for_slot():
    """On a spare node (ctrun --spares), ctrun starts the workers of a script
    that calls this before its node has a slot: they park here, without a
    rank, until the node takes a lost node's slot, and return with the
    slot's identity (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) in
    os.environ, ready for init_process_group. Call it after the work that
    needs no rank (imports, loading the model and the data). Returns at once
    in every other worker, and outside ctrun. ctrun knows that a script
    parks by this function's name in it."""
    path = os.environ.get("CTRUN_WORLD_FILE")
    if os.environ.get("CTRUN_SPARE") != "1" or not path:
        return
    from ._recovery import _POLL, _read_world

    while True:
        world = _read_world(path)
        if world is not None and world["CTRUN_ROUND_STATE"] == "ready":
            break
        time.sleep(_POLL)
    for key, value in world.items():
        if not key.startswith("CTRUN_ROUND"):
            os.environ[key] = value
    os.environ["CTRUN_SPARE"] = "0"
    _mark_round(0, world["CTRUN_ROUND"])


def cmake_prefix_path():
    """Where find_package(ctrun) finds libctrun_worker, its headers and its
    CMake package, installed with this module by the wheel:

        cmake -DCMAKE_PREFIX_PATH="$(python -c 'import ctrun;
            print(ctrun.cmake_prefix_path())')" ...

    FileNotFoundError where this copy of the module came without them (the
    copy ctrun gives its workers)."""
    import glob

    prefix = os.path.dirname(os.path.abspath(__file__))
    if not glob.glob(os.path.join(prefix, "lib*", "**", "ctrunConfig.cmake"), recursive=True):
        raise FileNotFoundError(
            "no CMake package of ctrun beside this module (%s): install the "
            "wheel (pip install ctrun), or point CMAKE_PREFIX_PATH at the "
            "prefix ctrun was installed to" % prefix
        )
    return prefix
