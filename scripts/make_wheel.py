#!/usr/bin/env python3
"""Writes ctrun's wheel from an installed prefix (scripts/build-wheel.sh).

The wheel holds:
  ctrun-V.data/scripts/{ctrun,ctrund}   the executables, on the
                                         environment's PATH once installed
  ctrun/*.py                             the Python module (the same source
                                         ctrun gives its workers)
  ctrun/lib*/libctrun_worker.so, ctrun/lib*/cmake/ctrun/, ctrun/include/
                                         the C++ library and its CMake
                                         package (ctrun.cmake_prefix_path())
"""

import argparse
import base64
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile

SUMMARY = "Distributed-training launcher and rendezvous daemon, torchrun's drop-in"


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return "sha256=" + digest.rstrip(b"=").decode()


def stripped(path, scratch):
    """A copy of `path` without its debug information (the wheel's size)."""
    out = os.path.join(scratch, os.path.basename(path))
    subprocess.run(["strip", "--strip-unneeded", "-o", out, path], check=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True, help="cmake --install prefix")
    parser.add_argument("--python", required=True, help="the ctrun module's folder")
    parser.add_argument("--glibc", required=True, help="the newest glibc needed, e.g. 2.34")
    parser.add_argument("--out", required=True, help="where the .whl goes")
    args = parser.parse_args()

    ctrun = os.path.join(args.prefix, "bin", "ctrun")
    said = subprocess.run([ctrun, "--version"], check=True, capture_output=True, text=True)
    version = said.stdout.split()[-1]  # "ctrun 0.1.0": the one version
    major, minor = args.glibc.split(".")[:2]
    tag = "py3-none-manylinux_%s_%s_%s" % (major, minor, platform.machine())
    name = "ctrun-%s-%s.whl" % (version, tag)
    data = "ctrun-%s.data" % version
    info = "ctrun-%s.dist-info" % version

    entries = []  # (path in the wheel, bytes, executable)
    with tempfile.TemporaryDirectory() as scratch:
        for program in ("ctrun", "ctrund"):
            path = stripped(os.path.join(args.prefix, "bin", program), scratch)
            with open(path, "rb") as f:
                entries.append(("%s/scripts/%s" % (data, program), f.read(), True))
        for source in sorted(os.listdir(args.python)):
            if source.endswith(".py"):
                with open(os.path.join(args.python, source), "rb") as f:
                    entries.append(("ctrun/" + source, f.read(), False))
        # The library, its headers and CMake package keep their layout under
        # the prefix, so that the package's relative paths still hold.
        for top in sorted(os.listdir(args.prefix)):
            if not (top.startswith("lib") or top == "include"):
                continue
            for root, _, files in os.walk(os.path.join(args.prefix, top)):
                for file in sorted(files):
                    path = os.path.join(root, file)
                    relative = os.path.relpath(path, args.prefix)
                    if file.endswith(".so") or ".so." in file:
                        path = stripped(path, scratch)
                    with open(path, "rb") as f:
                        entries.append(("ctrun/" + relative, f.read(), False))

    metadata = "\n".join([
        "Metadata-Version: 2.1",
        "Name: ctrun",
        "Version: " + version,
        "Summary: " + SUMMARY,
        "Requires-Python: >=3.8",
        "",
        "ctrun starts one training worker per GPU with torchrun's environment;",
        "agents on several nodes meet at a rendezvous served by ctrund or by an",
        "agent itself. `import ctrun` gives workers progress signals,",
        "coordinated stops and in-process recovery; libctrun_worker gives C++",
        "trainers the same.",
        "",
    ])
    wheel = "\n".join([
        "Wheel-Version: 1.0",
        "Generator: ctrun scripts/make_wheel.py",
        "Root-Is-Purelib: false",
        "Tag: " + tag,
        "",
    ])
    entries.append((info + "/METADATA", metadata.encode(), False))
    entries.append((info + "/WHEEL", wheel.encode(), False))
    entries.append((info + "/top_level.txt", b"ctrun\n", False))
    record = "".join("%s,%s,%d\n" % (p, record_hash(b), len(b)) for p, b, _ in entries)
    record += info + "/RECORD,,\n"
    entries.append((info + "/RECORD", record.encode(), False))

    os.makedirs(args.out, exist_ok=True)
    target = os.path.join(args.out, name)
    with zipfile.ZipFile(target + ".part", "w", zipfile.ZIP_DEFLATED) as whl:
        for path, body, executable in entries:
            entry = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            # A regular file (S_IFREG) with its mode: pip keeps the x bits.
            entry.external_attr = (0o100755 if executable else 0o100644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(entry, body)
    os.replace(target + ".part", target)
    print(target)


if __name__ == "__main__":
    sys.exit(main())
