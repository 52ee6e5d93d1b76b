"""ctrun's sitecustomize, on the PYTHONPATH of every Python worker that ctrun
launches (after the user's own entries).

It imports the `ctrun` module, so that a hung worker's Python stacks can be
taken even from a script that never imports ctrun itself (faulthandler on a
spare real-time signal), and so that its env:// init waits for rank 0's
store to listen (see the module). Then it runs the sitecustomize that it
would otherwise hide (the system's, or one further along sys.path), exactly
as Python would have: a worker sees no difference but those two.
"""


def _ctrun_chain():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    # Every folder that holds a copy of ctrun's (this one, and an outer
    # ctrun's when a worker runs ctrun in turn) is passed over: two copies
    # would chain to each other for ever.
    rest = list(sys.path)
    while True:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or not spec.origin:
            return
        if not _is_ctrun_copy(spec.origin):
            break
        found = os.path.dirname(os.path.abspath(spec.origin))
        rest = [p for p in rest if os.path.abspath(p or os.curdir) != found]
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    # An error in it is reported by site.py as for any sitecustomize.
    spec.loader.exec_module(module)


def _is_ctrun_copy(path):
    try:
        with open(path, "rb") as f:
            return _MARK in f.read(1 << 16)
    except OSError:
        return False


_MARK = b"ctrun's sitecustomize, on the PYTHONPATH of every Python worker"


try:
    import ctrun  # noqa: F401
except Exception:  # a worker must never fail because of ctrun
    pass
_ctrun_chain()
