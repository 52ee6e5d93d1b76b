"""python -m ctrun ARGS... runs the ctrun launcher installed with this module
(the wheel puts the executable in the environment's scripts directory)."""

import os
import shutil
import sys
import sysconfig


def _launcher():
    schemes = [sysconfig.get_default_scheme()]
    user = "%s_user" % os.name
    if user in sysconfig.get_scheme_names():
        schemes.append(user)
    for scheme in schemes:
        path = os.path.join(sysconfig.get_path("scripts", scheme), "ctrun")
        if os.access(path, os.X_OK):
            return path
    return shutil.which("ctrun")


def main():
    path = _launcher()
    if path is None:
        sys.exit(
            "python -m ctrun: no ctrun executable in this environment's "
            "scripts directory or on PATH: install the wheel (pip install ctrun)"
        )
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
