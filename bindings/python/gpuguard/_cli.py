"""gpuguard._cli — the `gpuguard` console command of the wheel: execs the C command line installed
inside the package (bin/gpuguard, which finds lib/libgpuguard.so.0 through its RUNPATH)."""
from __future__ import annotations

import os
import sys


def executable() -> str:
    """Path of the C command line inside this package (it may not exist in a source checkout)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "gpuguard")


def main() -> int:
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"gpuguard: {exe} is missing: this gpuguard package was not installed from a wheel "
                         "(pip install ./bindings/python builds one); run the build tree's gpuguard instead\n")
        return 127
    # `gpuguard plot` runs Python to draw: this interpreter, which has this package, whether or not its
    # venv is activated (the python3 on PATH may be another).
    os.environ.setdefault("GPUGUARD_PYTHON", sys.executable)
    # exec, not a child: signals, the exit status and the pid are the tool's own (`run` relies on it).
    os.execv(exe, ["gpuguard"] + sys.argv[1:])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
