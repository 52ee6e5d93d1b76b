#!/usr/bin/python3
"""Debian's torchrun (torch 1.13.1), corrected to run on Python 3.11.

torchrun 1.13 parses --redirects/--tee with Std.from_str, which looks the
value up by iterating the IntFlag enum Std; since Python 3.11 that iteration
skips NONE (0) and ALL (3), so the default "0" becomes None and torchrun
crashes ('NoneType' object has no attribute 'get'). This wrapper replaces
Std.from_str with a direct lookup and then runs torchrun unchanged. Used by
ctrun's side-by-side tests and benchmarks; arguments are torchrun's.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _std_from_str(vm):
    if re.fullmatch(r"[0-3]", vm):
        return api.Std(int(vm))
    if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", vm):
        return {int(i): api.Std(int(v))
                for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match Std format (e.g. 3 or 0:1,1:2)")


api.Std.from_str = staticmethod(_std_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
